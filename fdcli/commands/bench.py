"""`fd bench`: `serve` (any OpenAI-compatible server), `compare` (result files side by side), and the
in-process engine benchmarks `latency` and `throughput`.

Top-level imports are typer and fd's CLI helpers only; httpx, numpy, rich.progress and the engine load
inside the commands so `fd --help` stays fast. The work lives in `fdcli.bench`; this module parses,
validates (all option errors before any network traffic) and renders.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated, Optional

import typer

from fdcli.bench.vllm_argv import VllmArgsCommand
from fdcli.console import console, error_boundary
from fdcli.options import EngineCommand, engine_options
from fdcli_engine.errors import ConfigError

app = typer.Typer(
    help="Benchmark a server (serve), compare result files, or time the engine in-process.",
    no_args_is_help=True,
)

TARGET = "Target"
DATA = "Dataset"
TRAFFIC = "Traffic"
SAMPLING = "Sampling"
OUTPUT = "Output"


def _opt(*names: str, panel: str, help: str, **kw):
    return typer.Option(*names, rich_help_panel=panel, help=help, **kw)


# `fd bench serve` options, declared once (Typer reads them from the annotations).
BackendOpt = Annotated[
    str,
    _opt(
        "--backend",
        panel=TARGET,
        help="openai or vllm (/v1/completions), openai-chat (/v1/chat/completions), "
        "embeddings or openai-embeddings (/v1/embeddings).",
    ),
]
BaseUrlOpt = Annotated[
    Optional[str],
    _opt(
        "--base-url",
        panel=TARGET,
        help="Server URL, e.g. http://127.0.0.1:8000 (overrides --host/--port).",
    ),
]
HostOpt = Annotated[str, _opt("--host", panel=TARGET, help="Server host.")]
PortOpt = Annotated[int, _opt("--port", panel=TARGET, help="Server port.")]
EndpointOpt = Annotated[
    Optional[str],
    _opt("--endpoint", panel=TARGET, help="API path. Default: the backend's standard path."),
]
ModelOpt = Annotated[
    Optional[str],
    _opt("--model", panel=TARGET, help="Model name to request. Default: the first of /v1/models."),
]
ServedModelNameOpt = Annotated[
    Optional[str],
    _opt(
        "--served-model-name",
        panel=TARGET,
        help="Model name sent in requests when it differs from --model (vLLM's flag); --model then names the tokenizer.",
    ),
]
TokenizerOpt = Annotated[
    Optional[str],
    _opt(
        "--tokenizer",
        panel=TARGET,
        help="Tokenizer path for token lengths. Default: the served model if it is a local path, else fd's default model.",
    ),
]
ApiKeyOpt = Annotated[
    Optional[str],
    _opt(
        "--api-key",
        panel=TARGET,
        envvar="OPENAI_API_KEY",
        help="Bearer token (env OPENAI_API_KEY). Never printed or saved.",
    ),
]
HeaderOpt = Annotated[
    Optional[list[str]],
    _opt(
        "--header",
        panel=TARGET,
        help="Extra HTTP header K=V (several after one flag, or repeated); values are redacted in output.",
    ),
]
ReadyTimeoutOpt = Annotated[
    float,
    _opt(
        "--ready-timeout",
        "--ready-check-timeout-sec",
        panel=TARGET,
        help="Seconds to wait for the server to answer /v1/models or /health (fd always checks once).",
    ),
]
RequestTimeoutOpt = Annotated[
    float, _opt("--request-timeout", panel=TARGET, help="Seconds before one request counts as failed.")
]
DatasetOpt = Annotated[
    str,
    _opt(
        "--dataset",
        "--dataset-name",
        panel=DATA,
        help="random, sharegpt, custom, prefix-repetition (vLLM: prefix_repetition) or hf.",
    ),
]
DatasetPathOpt = Annotated[
    Optional[str],
    _opt(
        "--dataset-path",
        panel=DATA,
        help="File or folder for sharegpt/custom/hf (hf: also a cached dataset name).",
    ),
]
NumPromptsOpt = Annotated[int, _opt("--num-prompts", "-n", panel=DATA, help="Requests to send.")]
SeedOpt = Annotated[int, _opt("--seed", panel=DATA, help="Seed for prompts and arrival times.")]
RandomInputLenOpt = Annotated[
    int, _opt("--random-input-len", panel=DATA, help="random: prompt tokens after the shared prefix.")
]
RandomOutputLenOpt = Annotated[
    int, _opt("--random-output-len", panel=DATA, help="random: max output tokens.")
]
RandomRangeRatioOpt = Annotated[
    float,
    _opt("--random-range-ratio", panel=DATA, help="random: lengths drawn from \\[len·(1-r), len·(1+r)]."),
]
RandomPrefixLenOpt = Annotated[
    int, _opt("--random-prefix-len", panel=DATA, help="random: shared prefix tokens.")
]
SharegptOutputLenOpt = Annotated[
    Optional[int],
    _opt(
        "--sharegpt-output-len",
        panel=DATA,
        help="sharegpt: fixed output length. Default: the recorded reply's length.",
    ),
]
CustomOutputLenOpt = Annotated[
    int,
    _opt("--custom-output-len", panel=DATA, help="custom: output tokens for lines without output_tokens."),
]
PrefixRepetitionPrefixLenOpt = Annotated[
    int, _opt("--prefix-repetition-prefix-len", panel=DATA, help="prefix-repetition: prefix tokens.")
]
PrefixRepetitionSuffixLenOpt = Annotated[
    int, _opt("--prefix-repetition-suffix-len", panel=DATA, help="prefix-repetition: suffix tokens.")
]
PrefixRepetitionNumPrefixesOpt = Annotated[
    int,
    _opt("--prefix-repetition-num-prefixes", panel=DATA, help="prefix-repetition: distinct prefixes."),
]
PrefixRepetitionOutputLenOpt = Annotated[
    int, _opt("--prefix-repetition-output-len", panel=DATA, help="prefix-repetition: output tokens.")
]
HfSplitOpt = Annotated[str, _opt("--hf-split", panel=DATA, help="hf: split.")]
HfSubsetOpt = Annotated[
    Optional[str], _opt("--hf-subset", panel=DATA, help="hf: subset (configuration) name.")
]
HfPromptColumnOpt = Annotated[
    Optional[str],
    _opt(
        "--hf-prompt-column",
        panel=DATA,
        help="hf: column holding prompts. Default: prompt/question/instruction/input/text.",
    ),
]
HfOutputLenOpt = Annotated[int, _opt("--hf-output-len", panel=DATA, help="hf: output tokens.")]
RequestRateOpt = Annotated[
    float, _opt("--request-rate", panel=TRAFFIC, help="Requests/s; inf sends all at once.")
]
BurstinessOpt = Annotated[
    float,
    _opt(
        "--burstiness",
        panel=TRAFFIC,
        help="Gamma shape of arrival gaps: 1 = Poisson, <1 burstier, >1 steadier.",
    ),
]
MaxConcurrencyOpt = Annotated[
    Optional[int],
    _opt("--max-concurrency", panel=TRAFFIC, help="Most requests in flight. Default: unlimited."),
]
NumWarmupsOpt = Annotated[int, _opt("--num-warmups", panel=TRAFFIC, help="Untimed requests sent first.")]
RampUpOpt = Annotated[
    Optional[str],
    _opt(
        "--ramp-up",
        "--ramp-up-strategy",
        panel=TRAFFIC,
        help="linear or exponential: move the rate from start to end over the run (replaces --request-rate).",
    ),
]
RampUpStartRateOpt = Annotated[
    Optional[float],
    _opt(
        "--ramp-up-start-rate",
        "--ramp-up-start-rps",
        panel=TRAFFIC,
        help="Rate of the first request with --ramp-up.",
    ),
]
RampUpEndRateOpt = Annotated[
    Optional[float],
    _opt(
        "--ramp-up-end-rate",
        "--ramp-up-end-rps",
        panel=TRAFFIC,
        help="Rate of the last request with --ramp-up.",
    ),
]
TemperatureOpt = Annotated[
    Optional[float],
    _opt(
        "--temperature", panel=SAMPLING, help="Sent when given; else the server's default applies, as vLLM."
    ),
]
TopPOpt = Annotated[Optional[float], _opt("--top-p", panel=SAMPLING, help="Sent when given.")]
TopKOpt = Annotated[
    Optional[int], _opt("--top-k", panel=SAMPLING, help="Sent as an extra body field when given.")
]
MaxTokensOpt = Annotated[
    Optional[int],
    _opt(
        "--max-tokens",
        panel=SAMPLING,
        help="Output tokens for every request, overriding the dataset's lengths.",
    ),
]
IgnoreEosOpt = Annotated[
    bool,
    _opt(
        "--ignore-eos",
        panel=SAMPLING,
        help="Ask the server to generate exactly max_tokens (extra body field); always on for random, as vLLM.",
    ),
]
IncludeUsageOpt = Annotated[
    bool,
    _opt(
        "--include-usage/--no-include-usage",
        panel=TARGET,
        help="Ask for token counts in the stream (stream_options); turn off for servers that reject it.",
    ),
]
PercentilesOpt = Annotated[
    str,
    _opt("--percentiles", "--metric-percentiles", panel=OUTPUT, help="Comma-separated percentiles."),
]
PercentileMetricsOpt = Annotated[
    Optional[str],
    _opt(
        "--percentile-metrics",
        panel=OUTPUT,
        help="Comma-separated metrics to summarize: ttft, tpot, itl, e2el (default ttft,tpot,itl; embeddings: e2el).",
    ),
]
GoodputOpt = Annotated[
    Optional[list[str]],
    _opt(
        "--goodput",
        panel=OUTPUT,
        help="SLOs in ms, several after one flag as in vLLM: --goodput ttft:200 tpot:50 e2el:2000.",
    ),
]
SaveResultOpt = Annotated[
    bool,
    _opt(
        "--save-result",
        panel=OUTPUT,
        help="Write the results as JSON (vLLM's keys and file name); fd's older --save-result FILE "
        "still works and means --save-result --result-filename FILE.",
    ),
]
ResultDirOpt = Annotated[
    Optional[Path],
    _opt("--result-dir", panel=OUTPUT, help="Folder for --save-result (made if missing). Default: here."),
]
ResultFilenameOpt = Annotated[
    Optional[str],
    _opt(
        "--result-filename",
        panel=OUTPUT,
        help="File name for --save-result. Default: {label}-{rate}qps[-concurrencyN]-{model}-{date}.json.",
    ),
]
LabelOpt = Annotated[
    Optional[str],
    _opt("--label", panel=OUTPUT, help="Result label and file-name prefix. Default: the backend."),
]
MetadataOpt = Annotated[
    Optional[list[str]],
    _opt(
        "--metadata",
        panel=OUTPUT,
        help="KEY=VALUE pairs saved in the result file, several after one flag: --metadata tp=1 v=2.",
    ),
]
SaveDetailedOpt = Annotated[
    bool,
    _opt("--save-detailed", panel=OUTPUT, help="Include per-request records and lists in --save-result."),
]
AppendResultOpt = Annotated[
    bool,
    _opt(
        "--append-result",
        panel=OUTPUT,
        help="Append to the --save-result file (one JSON object per line) instead of replacing it.",
    ),
]
ProgressOpt = Annotated[
    bool, _opt("--progress/--no-progress", panel=OUTPUT, help="Live progress bar on stderr.")
]
DisableTqdmOpt = Annotated[
    bool, _opt("--disable-tqdm", panel=OUTPUT, help="vLLM's spelling of --no-progress.")
]
InputLenOpt = Annotated[
    Optional[int],
    _opt("--input-len", panel=DATA, help="vLLM's general input length: sets --random-input-len."),
]
OutputLenOpt = Annotated[
    Optional[int],
    _opt(
        "--output-len", panel=DATA, help="vLLM's general output length: sets every dataset's output length."
    ),
]
SkipChatTemplateOpt = Annotated[
    bool,
    _opt(
        "--skip-chat-template",
        "--custom-skip-chat-template",
        panel=DATA,
        help="custom: send prompts as written, not in the tokenizer's chat template (as vLLM does).",
    ),
]
DisableShuffleOpt = Annotated[
    bool, _opt("--disable-shuffle", panel=DATA, help="sharegpt/custom/hf: keep the file's order.")
]
NoOversampleOpt = Annotated[
    bool,
    _opt(
        "--no-oversample",
        panel=DATA,
        help="sharegpt/custom/hf: send each prompt once even if that is fewer than --num-prompts.",
    ),
]
ExtraBodyOpt = Annotated[
    Optional[str],
    _opt(
        "--extra-body",
        panel=SAMPLING,
        help="JSON object merged into every request body (wins over the flags).",
    ),
]
ChatTemplateKwargsOpt = Annotated[
    Optional[str],
    _opt(
        "--chat-template-kwargs",
        panel=DATA,
        help="custom: JSON variables for the client-side chat template, as vLLM (not sent; use --extra-body).",
    ),
]
MinPOpt = Annotated[Optional[float], _opt("--min-p", panel=SAMPLING, help="Sent as min_p when given.")]
FrequencyPenaltyOpt = Annotated[
    Optional[float], _opt("--frequency-penalty", panel=SAMPLING, help="Sent when given.")
]
PresencePenaltyOpt = Annotated[
    Optional[float], _opt("--presence-penalty", panel=SAMPLING, help="Sent when given.")
]
RepetitionPenaltyOpt = Annotated[
    Optional[float], _opt("--repetition-penalty", panel=SAMPLING, help="Sent when given.")
]
LogprobsOpt = Annotated[
    Optional[int],
    _opt(
        "--logprobs",
        panel=SAMPLING,
        help="Logprobs per token: logprobs=N on completions, logprobs+top_logprobs=N on chat.",
    ),
]
RequestIdPrefixOpt = Annotated[
    Optional[str],
    _opt(
        "--request-id-prefix",
        panel=TARGET,
        help="x-request-id of request i is PREFIX+i. Default: bench-<8 random hex>-.",
    ),
]
TokenizerModeOpt = Annotated[
    Optional[str],
    _opt("--tokenizer-mode", panel=TARGET, help="Accepted for vLLM; fd reads the tokenizer files."),
]
TrustRemoteCodeOpt = Annotated[
    bool, _opt("--trust-remote-code", panel=TARGET, help="Accepted for vLLM; fd runs no tokenizer code.")
]
SkipTokenizerInitOpt = Annotated[
    bool,
    _opt(
        "--skip-tokenizer-init",
        panel=TARGET,
        help="Load no tokenizer: token counts come from the server's usage.",
    ),
]
InsecureOpt = Annotated[
    bool, _opt("--insecure", panel=TARGET, help="Do not verify TLS certificates of an https --base-url.")
]
ProfileOpt = Annotated[bool, _opt("--profile", panel=OUTPUT, help="vLLM's profiler hook: not supported.")]
PlotTimelineOpt = Annotated[
    bool, _opt("--plot-timeline", panel=OUTPUT, help="Accepted for vLLM; fd draws no HTML timeline.")
]
UseBeamSearchOpt = Annotated[
    bool,
    _opt(
        "--use-beam-search",
        panel=SAMPLING,
        help="serve: no effect, as in vLLM's; latency: time LLM.beam_search of width --n.",
    ),
]
ChartOpt = Annotated[
    bool, _opt("--chart/--no-chart", panel=OUTPUT, help="Throughput-over-time and TTFT charts.")
]


@app.command("serve", cls=VllmArgsCommand)
def serve(
    backend: BackendOpt = "openai",
    base_url: BaseUrlOpt = None,
    host: HostOpt = "127.0.0.1",
    port: PortOpt = 8000,
    endpoint: EndpointOpt = None,
    model: ModelOpt = None,
    served_model_name: ServedModelNameOpt = None,
    tokenizer: TokenizerOpt = None,
    api_key: ApiKeyOpt = None,
    header: HeaderOpt = None,
    ready_timeout: ReadyTimeoutOpt = 60.0,
    request_timeout: RequestTimeoutOpt = 600.0,
    dataset: DatasetOpt = "random",
    dataset_path: DatasetPathOpt = None,
    num_prompts: NumPromptsOpt = 100,
    seed: SeedOpt = 0,
    random_input_len: RandomInputLenOpt = 128,
    random_output_len: RandomOutputLenOpt = 128,
    random_range_ratio: RandomRangeRatioOpt = 0.0,
    random_prefix_len: RandomPrefixLenOpt = 0,
    sharegpt_output_len: SharegptOutputLenOpt = None,
    custom_output_len: CustomOutputLenOpt = 256,
    prefix_repetition_prefix_len: PrefixRepetitionPrefixLenOpt = 256,
    prefix_repetition_suffix_len: PrefixRepetitionSuffixLenOpt = 256,
    prefix_repetition_num_prefixes: PrefixRepetitionNumPrefixesOpt = 10,
    prefix_repetition_output_len: PrefixRepetitionOutputLenOpt = 128,
    hf_split: HfSplitOpt = "train",
    hf_subset: HfSubsetOpt = None,
    hf_prompt_column: HfPromptColumnOpt = None,
    hf_output_len: HfOutputLenOpt = 256,
    request_rate: RequestRateOpt = math.inf,
    burstiness: BurstinessOpt = 1.0,
    max_concurrency: MaxConcurrencyOpt = None,
    num_warmups: NumWarmupsOpt = 0,
    ramp_up: RampUpOpt = None,
    ramp_up_start_rate: RampUpStartRateOpt = None,
    ramp_up_end_rate: RampUpEndRateOpt = None,
    temperature: TemperatureOpt = None,
    top_p: TopPOpt = None,
    top_k: TopKOpt = None,
    max_tokens: MaxTokensOpt = None,
    ignore_eos: IgnoreEosOpt = False,
    include_usage: IncludeUsageOpt = True,
    percentiles: PercentilesOpt = "99",
    percentile_metrics: PercentileMetricsOpt = None,
    goodput: GoodputOpt = None,
    save_result: SaveResultOpt = False,
    result_dir: ResultDirOpt = None,
    result_filename: ResultFilenameOpt = None,
    label: LabelOpt = None,
    metadata: MetadataOpt = None,
    save_detailed: SaveDetailedOpt = False,
    append_result: AppendResultOpt = False,
    progress: ProgressOpt = True,
    disable_tqdm: DisableTqdmOpt = False,
    chart: ChartOpt = True,
    input_len: InputLenOpt = None,
    output_len: OutputLenOpt = None,
    extra_body: ExtraBodyOpt = None,
    min_p: MinPOpt = None,
    frequency_penalty: FrequencyPenaltyOpt = None,
    presence_penalty: PresencePenaltyOpt = None,
    repetition_penalty: RepetitionPenaltyOpt = None,
    logprobs: LogprobsOpt = None,
    request_id_prefix: RequestIdPrefixOpt = None,
    tokenizer_mode: TokenizerModeOpt = None,
    trust_remote_code: TrustRemoteCodeOpt = False,
    skip_tokenizer_init: SkipTokenizerInitOpt = False,
    insecure: InsecureOpt = False,
    profile: ProfileOpt = False,
    plot_timeline: PlotTimelineOpt = False,
    use_beam_search: UseBeamSearchOpt = False,
    skip_chat_template: SkipChatTemplateOpt = False,
    chat_template_kwargs: ChatTemplateKwargsOpt = None,
    disable_shuffle: DisableShuffleOpt = False,
    no_oversample: NoOversampleOpt = False,
) -> None:
    """Benchmark any OpenAI-compatible server (fd, vLLM, llama.cpp) with streamed requests."""
    from fdcli.bench.serve_cmd import ServeOptions, run_serve

    progress = progress and not disable_tqdm
    opts = ServeOptions(**{k: v for k, v in locals().items() if k in ServeOptions.field_names()})
    with error_boundary():
        code = run_serve(opts)
    if code:
        raise typer.Exit(code)


@app.command("compare")
def compare(
    files: Annotated[
        list[Path],
        typer.Argument(
            help="Result files from --save-result / --output-json, fd's or vLLM's; the first run is the baseline."
        ),
    ],
) -> None:
    """Print benchmark runs side by side with ratios against the first (every run of an appended file)."""
    from fdcli.bench.render import compare_table
    from fdcli.bench.results import compare_rows, load_results

    with error_boundary():
        names, results = [], []
        for f in files:
            runs = load_results(f)
            names += [f.name] if len(runs) == 1 else [f"{f.name}#{i}" for i in range(1, len(runs) + 1)]
            results += runs
        if len(results) < 2:
            raise ConfigError(
                "give at least two runs to compare: two result files, or one with --append-result runs"
            )
        kinds = {r.get("kind") for r in results}
        if len(kinds) > 1:
            raise ConfigError(
                f"cannot compare different kinds of results: {', '.join(map(str, sorted(map(str, kinds))))}"
            )
        console.print(compare_table(names, compare_rows(results)))


# `fd bench latency|throughput` options shared with `vllm bench latency|throughput`, declared once.
NOpt = Annotated[int, typer.Option("--n", help="Completions per prompt (vLLM's --n).")]
DisableDetokenizeOpt = Annotated[
    bool, typer.Option("--disable-detokenize", help="Accepted for vLLM; fd's engine always detokenizes.")
]


def _offline_notes(kind: str, **flags) -> None:
    from fdcli.bench.offline import vllm_offline_flags
    from fdcli.console import err_console

    for line in vllm_offline_flags(kind, **flags):
        err_console.print(line, highlight=False, markup=False)


@app.command("latency", cls=EngineCommand)
@engine_options
def latency(
    input_len: Annotated[int, typer.Option("--input-len", help="Prompt tokens.")] = 32,
    output_len: Annotated[int, typer.Option("--output-len", help="Output tokens (EOS ignored).")] = 128,
    batch_size: Annotated[int, typer.Option("--batch-size", help="Prompts per generate call.")] = 8,
    num_iters_warmup: Annotated[int, typer.Option("--num-iters-warmup", help="Untimed iterations.")] = 2,
    num_iters: Annotated[int, typer.Option("--num-iters", help="Timed iterations.")] = 10,
    percentiles: Annotated[
        str, typer.Option("--percentiles", help="Comma-separated percentiles.")
    ] = "10,25,50,75,90,99",
    output_json: Annotated[
        Optional[Path],
        typer.Option(
            "--output-json", help="Write the results as JSON (fd's keys and vLLM's avg_latency, ...)."
        ),
    ] = None,
    n: NOpt = 1,
    use_beam_search: UseBeamSearchOpt = False,
    disable_detokenize: DisableDetokenizeOpt = False,
    *,
    engine_args: dict,
) -> None:
    """Time one batch's generate() end to end, in-process."""
    from fdcli.bench.offline import OfflineOptions, run_offline

    opts = OfflineOptions(
        n=n,
        use_beam_search=use_beam_search,
        kind="latency",
        input_len=input_len,
        output_len=output_len,
        batch_size=batch_size,
        num_iters_warmup=num_iters_warmup,
        num_iters=num_iters,
        percentiles=percentiles,
        output_json=output_json,
    )
    with error_boundary():
        _offline_notes("latency", disable_detokenize=disable_detokenize)
        run_offline(opts, engine_args)


@app.command("throughput", cls=EngineCommand)
@engine_options
def throughput(
    input_len: Annotated[int, typer.Option("--input-len", help="Prompt tokens.")] = 128,
    output_len: Annotated[int, typer.Option("--output-len", help="Output tokens (EOS ignored).")] = 128,
    num_prompts: Annotated[int, typer.Option("--num-prompts", help="Prompts submitted at once.")] = 64,
    num_iters_warmup: Annotated[
        int, typer.Option("--num-iters-warmup", help="Untimed runs (of a small batch).")
    ] = 1,
    num_iters: Annotated[int, typer.Option("--num-iters", help="Timed runs over all prompts.")] = 1,
    percentiles: Annotated[
        str, typer.Option("--percentiles", help="Comma-separated percentiles of the run times.")
    ] = "50,90,99",
    output_json: Annotated[
        Optional[Path],
        typer.Option(
            "--output-json", help="Write the results as JSON (fd's keys and vLLM's elapsed_time, ...)."
        ),
    ] = None,
    n: NOpt = 1,
    disable_detokenize: DisableDetokenizeOpt = False,
    backend: Annotated[
        str, typer.Option("--backend", help="vllm: the in-process engine (the only one fd has).")
    ] = "vllm",
    dataset_name: Annotated[
        str, typer.Option("--dataset-name", help="random: random token ids (the only one offline).")
    ] = "random",
    random_range_ratio: Annotated[
        float,
        typer.Option("--random-range-ratio", help="Lengths drawn from \\[len·(1-r), len·(1+r)] per prompt."),
    ] = 0.0,
    prefix_len: Annotated[
        int, typer.Option("--prefix-len", help="Random tokens shared by every prompt, before its own.")
    ] = 0,
    async_engine: Annotated[
        bool, typer.Option("--async-engine", help="Accepted for vLLM; fd's in-process engine has one mode.")
    ] = False,
    *,
    engine_args: dict,
) -> None:
    """Offline throughput: all prompts at once through the in-process engine."""
    from fdcli.bench.offline import OfflineOptions, run_offline

    opts = OfflineOptions(
        n=n,
        range_ratio=random_range_ratio,
        prefix_len=prefix_len,
        kind="throughput",
        input_len=input_len,
        output_len=output_len,
        batch_size=num_prompts,
        num_iters_warmup=num_iters_warmup,
        num_iters=num_iters,
        percentiles=percentiles,
        output_json=output_json,
    )
    with error_boundary():
        _offline_notes(
            "throughput", backend=backend, dataset_name=dataset_name, async_engine=async_engine,
            disable_detokenize=disable_detokenize,
        )  # fmt: skip
        run_offline(opts, engine_args)
