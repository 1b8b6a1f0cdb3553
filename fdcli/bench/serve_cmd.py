"""`fd bench serve` end to end: validate options, wait for the server, build requests, run, report.

Order matters for the user: every option error is reported before any network traffic; a Ctrl-C
during the run still prints (and saves) the summary of the requests that finished.
"""

from __future__ import annotations

import dataclasses
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from fdcli.bench.client import BACKENDS, BackendConfig, resolve_backend
from fdcli.bench.datasets import DatasetOptions, build_requests, canonical_name
from fdcli.bench.early_stop import early_stop_warning
from fdcli.bench.metrics import compute_metrics, parse_goodput, parse_percentiles
from fdcli.bench.request_loop import RunState, TrafficConfig, run_benchmark, wait_ready
from fdcli.bench.results import REDACTED, build_result, record_to_dict, redact_headers, save_result
from fdcli.bench.tokenize import default_tokenizer_path, load_tokenizer
from fdcli.bench.traffic import arrival_offsets
from fdcli.bench.vllm_flags import (
    apply_general_lengths,
    check_refused,
    compat_notes,
    default_percentile_metrics,
    default_request_id_prefix,
    parse_chat_template_kwargs,
    parse_extra_body,
    random_ignores_eos,
    request_extra_body,
)
from fdcli.bench.vllm_result import (
    DATE_FORMAT,
    default_result_filename,
    parse_metadata,
    parse_percentile_metrics,
    vllm_result_keys,
)
from fdcli.server_url import server_url
from fdcli_engine.entrypoints.event_loop import event_loop_runner
from fdcli_engine.errors import ConfigError

EXIT_INTERRUPTED = 130
# DatasetOptions fields not copied by name from ServeOptions.
_OWN_DS_FIELDS = ("name", "path", "chat_template_kwargs")


@dataclass
class ServeOptions:
    backend: str = "openai"
    base_url: str | None = None
    host: str = "127.0.0.1"
    port: int = 8000
    endpoint: str | None = None
    model: str | None = None
    served_model_name: str | None = None
    tokenizer: str | None = None
    api_key: str | None = None
    header: list[str] | None = None
    ready_timeout: float = 60.0
    request_timeout: float = 600.0
    dataset: str = "random"
    dataset_path: str | None = None
    num_prompts: int = 100
    seed: int = 0
    random_input_len: int = 128
    random_output_len: int = 128
    random_range_ratio: float = 0.0
    random_prefix_len: int = 0
    sharegpt_output_len: int | None = None
    custom_output_len: int = 256
    prefix_repetition_prefix_len: int = 256
    prefix_repetition_suffix_len: int = 256
    prefix_repetition_num_prefixes: int = 10
    prefix_repetition_output_len: int = 128
    hf_split: str = "train"
    hf_subset: str | None = None
    hf_prompt_column: str | None = None
    hf_output_len: int = 256
    request_rate: float = math.inf
    burstiness: float = 1.0
    max_concurrency: int | None = None
    num_warmups: int = 0
    ramp_up: str | None = None
    ramp_up_start_rate: float | None = None
    ramp_up_end_rate: float | None = None
    temperature: float | None = None  # None: not sent, the server's default applies (as vLLM)
    top_p: float | None = None
    top_k: int | None = None
    max_tokens: int | None = None
    ignore_eos: bool = False
    include_usage: bool = True
    percentiles: str = "99"
    percentile_metrics: str | None = None  # vLLM's default: ttft,tpot,itl; e2el for embeddings
    goodput: list[str] | None = None
    save_result: bool = False
    result_dir: Path | None = None
    result_filename: str | None = None
    label: str | None = None
    metadata: list[str] | None = None
    save_detailed: bool = False
    append_result: bool = False
    progress: bool = True
    chart: bool = True
    # vLLM's flags (see vllm_flags.py)
    input_len: int | None = None
    output_len: int | None = None
    extra_body: str | None = None
    min_p: float | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    repetition_penalty: float | None = None
    logprobs: int | None = None
    request_id_prefix: str | None = None
    tokenizer_mode: str | None = None
    trust_remote_code: bool = False
    skip_tokenizer_init: bool = False
    insecure: bool = False
    profile: bool = False
    plot_timeline: bool = False
    use_beam_search: bool = False
    skip_chat_template: bool = False
    chat_template_kwargs: str | None = None
    disable_shuffle: bool = False
    no_oversample: bool = False
    requested_backend: str | None = None  # --backend as given (vLLM's name, kept for the result file)

    @classmethod
    def field_names(cls) -> set[str]:
        return {f.name for f in dataclasses.fields(cls)}


def parse_headers(items: list[str] | None) -> dict[str, str]:
    headers = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--header {item.split('=')[0]!r}...: expected KEY=VALUE")
        headers[key.strip()] = value
    return headers


def _check(opts: ServeOptions) -> None:
    """Validate, and put vLLM's spellings (backend and dataset names, general lengths) in fd's terms."""
    opts.requested_backend = opts.requested_backend or opts.backend
    opts.backend = resolve_backend(opts.backend)
    opts.dataset = canonical_name(opts.dataset)
    check_refused(opts)
    if opts.logprobs is not None and opts.logprobs < 0:
        raise ConfigError(f"--logprobs must be 0 or more, got {opts.logprobs}")
    for flag, value in (("--input-len", opts.input_len), ("--output-len", opts.output_len)):
        if value is not None and value < 1:
            raise ConfigError(f"{flag} must be at least 1, got {value}")
    apply_general_lengths(opts)
    if opts.endpoint is not None and not opts.endpoint.startswith("/"):
        raise ConfigError(f"--endpoint {opts.endpoint!r} must be a path starting with '/'")
    if opts.max_concurrency is not None and opts.max_concurrency < 1:
        raise ConfigError(f"--max-concurrency must be at least 1, got {opts.max_concurrency}")
    if opts.num_warmups < 0:
        raise ConfigError("--num-warmups must be 0 or more")
    if not opts.request_timeout > 0:
        raise ConfigError("--request-timeout must be positive")
    if opts.temperature is not None and not 0.0 <= opts.temperature <= 2.0:
        raise ConfigError(f"--temperature must be between 0 and 2, got {opts.temperature}")
    if opts.max_tokens is not None and opts.max_tokens < 1:
        raise ConfigError(f"--max-tokens must be at least 1, got {opts.max_tokens}")
    if opts.save_detailed and not opts.save_result:
        raise ConfigError("--save-detailed needs --save-result")
    if (opts.result_dir is not None or opts.result_filename or opts.append_result) and not opts.save_result:
        raise ConfigError("--result-dir/--result-filename/--append-result need --save-result")
    parse_metadata(opts.metadata)
    opts.percentile_metrics = opts.percentile_metrics or default_percentile_metrics(opts.backend)
    parse_percentile_metrics(opts.percentile_metrics)
    parse_extra_body(opts.extra_body)
    parse_chat_template_kwargs(opts.chat_template_kwargs)
    if random_ignores_eos(opts):
        opts.ignore_eos = True


def _effective_config(opts: ServeOptions, base_url: str, model: str, tok_note: str, headers: dict) -> dict:
    config = dataclasses.asdict(opts)
    config.update(
        base_url=base_url,
        endpoint=opts.endpoint or BACKENDS[opts.backend],
        model=model,
        tokenizer=opts.tokenizer,
        tokenizer_used=tok_note,
        header=redact_headers(headers),
        api_key=REDACTED if opts.api_key else None,
        percentiles=parse_percentiles(opts.percentiles),
        goodput=parse_goodput(opts.goodput) and {k: v * 1000 for k, v in parse_goodput(opts.goodput).items()},
        result_dir=str(opts.result_dir) if opts.result_dir else None,
        percentile_metrics=parse_percentile_metrics(opts.percentile_metrics),
        metadata=parse_metadata(opts.metadata),
    )
    return config


def _note(message: str) -> None:
    sys.stderr.write(message + "\n")


def _prepare(opts: ServeOptions):
    """Everything before the first timed request; raises ConfigError/ServerNotReady with one line."""
    _check(opts)
    for line in compat_notes(opts):
        _note(line)
    percentiles = parse_percentiles(opts.percentiles)
    slo = parse_goodput(opts.goodput)
    user_headers = parse_headers(opts.header)
    headers = dict(user_headers)
    offsets = arrival_offsets(
        opts.num_prompts, opts.request_rate, opts.burstiness, opts.seed,
        opts.ramp_up, opts.ramp_up_start_rate, opts.ramp_up_end_rate,
    )  # fmt: skip
    ds_opts = DatasetOptions(
        name=opts.dataset, path=opts.dataset_path,
        chat_template_kwargs=parse_chat_template_kwargs(opts.chat_template_kwargs),
        **{f.name: getattr(opts, f.name) for f in dataclasses.fields(DatasetOptions) if f.name not in _OWN_DS_FIELDS},
    )  # fmt: skip
    if opts.api_key:
        headers.setdefault("Authorization", f"Bearer {opts.api_key}")
    base_url = server_url(opts.base_url, "--base-url") if opts.base_url else f"http://{opts.host}:{opts.port}"
    if base_url.endswith("/v1"):
        base_url = base_url[:-3]  # accept the OpenAI-SDK style base URL too
    models = wait_ready(base_url, headers, opts.ready_timeout, verify=not opts.insecure)
    # vLLM's split: --model names the model (its tokenizer, the result's model_id), --served-model-name
    # the name requests carry; either defaults to the other, then to the first of /v1/models.
    model = opts.model or opts.served_model_name or (models[0] if models else None)
    if not model:
        raise ConfigError(f"{base_url}/v1/models lists no model: pass --model NAME")
    served = opts.served_model_name or model
    if opts.skip_tokenizer_init:  # vLLM's meaning: no client tokenizer; counts come from the server
        tokenizer, tok_note = None, "no tokenizer (--skip-tokenizer-init)"
    else:
        tokenizer, tok_note = load_tokenizer(opts.tokenizer or default_tokenizer_path(model))
    if opts.tokenizer and tokenizer is None and not opts.skip_tokenizer_init:
        raise ConfigError(f"--tokenizer: {tok_note}")
    _note(f"fd bench: {served} at {base_url} — {tok_note}")
    requests = build_requests(ds_opts, tokenizer, opts.num_prompts, opts.seed)
    if opts.max_tokens is not None:
        for req in requests:
            req.output_len = opts.max_tokens
    cfg = BackendConfig(
        base_url=base_url, backend=opts.backend, endpoint=opts.endpoint, model=served, headers=headers,
        temperature=opts.temperature, top_p=opts.top_p, top_k=opts.top_k, ignore_eos=opts.ignore_eos,
        include_usage=opts.include_usage, request_timeout=opts.request_timeout, logprobs=opts.logprobs,
        extra_body=request_extra_body(opts, pooling=opts.backend == "embeddings"),
        request_id_prefix=opts.request_id_prefix or default_request_id_prefix(), verify=not opts.insecure,
    )  # fmt: skip
    traffic = TrafficConfig(offsets, opts.max_concurrency, opts.num_warmups)
    config = _effective_config(opts, base_url, model, tok_note, user_headers)
    return cfg, requests, traffic, tokenizer, percentiles, slo, config


def _run_with_progress(cfg, requests, traffic, tokenizer, state: RunState, show: bool) -> bool:
    """Run the loop; return True if interrupted by Ctrl-C (partial results are in `state`)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from fdcli.console import err_console

    columns = (
        TextColumn("[bold]benchmark"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[failed]} failed"),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=err_console, disable=not show, transient=False) as bar:
        task = bar.add_task("requests", total=len(requests), failed=0)
        failed = [0]

        def on_done(record) -> None:
            failed[0] += not record.ok
            bar.update(task, advance=1, failed=failed[0])

        try:
            with event_loop_runner() as runner:
                runner.run(run_benchmark(cfg, requests, traffic, state, tokenizer, on_done))
        except KeyboardInterrupt:
            return True
    return False


def _run_info(opts: ServeOptions, config: dict, date: str) -> dict:
    """The run's identity in vLLM's result keys."""
    return {
        "date": date,
        "backend": opts.requested_backend or opts.backend,
        "label": opts.label,
        "model_id": config["model"],
        "tokenizer_id": opts.tokenizer or config["model"],
        "num_prompts": opts.num_prompts,
        "request_rate": opts.request_rate,
        "burstiness": opts.burstiness,
        "max_concurrency": opts.max_concurrency,
        "ramp_up_strategy": opts.ramp_up,
        "ramp_up_start_rps": opts.ramp_up_start_rate,
        "ramp_up_end_rps": opts.ramp_up_end_rate,
    }


def result_path(opts: ServeOptions, model: str, date: str) -> Path:
    """--result-dir / (--result-filename or vLLM's default name)."""
    name = opts.result_filename or default_result_filename(
        opts.label or opts.requested_backend or opts.backend, opts.request_rate, opts.max_concurrency, model, date,
        opts.ramp_up, opts.ramp_up_start_rate, opts.ramp_up_end_rate,
    )  # fmt: skip
    if opts.result_dir is None:
        return Path(name)
    try:
        opts.result_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(
            f"cannot make --result-dir {str(opts.result_dir)!r}: {exc.strerror or exc}"
        ) from None
    return opts.result_dir / name


def _save(opts: ServeOptions, config: dict, metrics: dict, state: RunState, percentiles) -> None:
    from datetime import datetime

    date = datetime.now().strftime(DATE_FORMAT)
    records = sorted(state.records, key=lambda r: r.index)
    detail = [record_to_dict(r, state.bench_start) for r in records]
    result = build_result("serve", config, metrics, detail if opts.save_detailed else None)
    result.update(
        vllm_result_keys(
            _run_info(opts, config, date), parse_metadata(opts.metadata), metrics, records,
            parse_percentile_metrics(opts.percentile_metrics), percentiles, opts.save_detailed,
        )
    )  # fmt: skip
    path = result_path(opts, config["model"], date)
    save_result(path, result, append=opts.append_result)
    _note(f"results saved to {path}")


def run_serve(opts: ServeOptions) -> int:
    """Run the benchmark and report; returns the exit code (0, or 130 after Ctrl-C)."""
    from fdcli.bench.render import print_report

    cfg, requests, traffic, tokenizer, percentiles, slo, config = _prepare(opts)
    state = RunState()
    interrupted = _run_with_progress(cfg, requests, traffic, tokenizer, state, opts.progress)
    if state.warmup_errors:
        _note(f"warning: {len(state.warmup_errors)} warmup request(s) failed: {state.warmup_errors[0]}")
    if state.bench_start is None:
        _note("interrupted before the benchmark started: no results")
        return EXIT_INTERRUPTED
    end = state.bench_end if state.bench_end is not None else time.perf_counter()
    metrics = compute_metrics(state.records, end - state.bench_start, state.bench_start, percentiles, slo)
    metrics["interrupted"] = interrupted
    print_report(
        metrics, state.records, chart=opts.chart, selected=parse_percentile_metrics(opts.percentile_metrics)
    )
    if opts.save_result:
        _save(opts, config, metrics, state, percentiles)
    warning = early_stop_warning(state.records, requests, opts.backend, opts.ignore_eos)
    if warning:
        _note(warning)
    return EXIT_INTERRUPTED if interrupted else 0
