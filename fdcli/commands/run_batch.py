"""`fd run-batch`: an OpenAI Batch-format JSONL file through `fd serve`'s serving layer, without HTTP
(the engine core runs in a child process, as under `fd serve`; it is stopped however the run ends).

Exit codes: 0 every line succeeded; 3 the run finished but some lines failed (each has an error record)
or --strict stopped it; 2 bad options or input (e.g. duplicate custom_ids, found before the model
loads); 1 the run itself failed (engine error, I/O); 130 interrupted by Ctrl-C or SIGTERM (OUT.partial
is kept for --resume). Engine internals load inside the command only.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from fdcli.console import EXIT_USAGE, error_boundary, fail
from fdcli.options import (
    AllowedLocalMediaOpt,
    AllowedMediaDomainsOpt,
    ChatTemplateOpt,
    LimitMmOpt,
    ReasoningParserOpt,
    ResponseRoleOpt,
    ToolCallParserOpt,
    engine_options,
    vllm_option,
)

EXIT_LINES_FAILED = (
    3  # mirrors fdcli_engine.entrypoints.batch.EXIT_LINES_FAILED (not imported: paddle-free CLI)
)

# vLLM's and FastDeploy's names first (-i/--input-file, -o/--output-file); --input/--output are fd's own.
InputOpt = Annotated[
    str,
    typer.Option(
        "--input-file",
        "--input",
        "-i",
        help="Input JSONL file in the OpenAI Batch format; '-' reads stdin.",
    ),
]
OutputOpt = Annotated[
    str,
    typer.Option(
        "--output-file",
        "--output",
        "-o",
        help="Output JSONL file (written as OUT.partial, renamed when done); '-' is stdout.",
    ),
]
StrictOpt = Annotated[bool, typer.Option("--strict", help="Stop at the first line that fails.")]
ResumeOpt = Annotated[
    bool,
    typer.Option(
        "--resume", help="Skip every custom_id already in OUT.partial or OUT (after a crash or kill)."
    ),
]
SummaryJsonOpt = Annotated[
    Optional[Path], typer.Option("--summary-json", help="Also write the final summary to this JSON file.")
]
MaxInflightOpt = Annotated[
    Optional[int],
    typer.Option("--max-inflight", help="Lines in flight at once. Default: 2 × --max-num-seqs.", min=1),
]
ProgressOpt = Annotated[
    bool, typer.Option("--progress/--no-progress", help="Progress bar on stderr (only on a terminal).")
]

# vLLM's own run-batch flags (vllm/entrypoints/openai/run_batch.py), each with its effect here or one
# log line saying why it has none (vllm_batch_notes); --enable-metrics is refused, naming what to use.
OutputTmpDirOpt = Annotated[
    Optional[str], vllm_option("--output-tmp-dir", help="No effect (logged): fd uploads no output to a URL.")
]
MaxLogLenOpt = Annotated[
    Optional[int], vllm_option("--max-log-len", help="No effect (logged): fd logs no prompts.")
]
EnableMetricsOpt = Annotated[
    bool,
    vllm_option(
        "--enable-metrics",
        help="Not supported (refused): the counters are in the summary (--summary-json); for Prometheus, "
        "fd serve's /metrics.",
    ),
]
MetricsUrlOpt = Annotated[
    Optional[str],
    vllm_option("--url", help="vLLM's metrics-server address (--enable-metrics): no effect (logged)."),
]
MetricsPortOpt = Annotated[
    Optional[int],
    vllm_option("--port", help="vLLM's metrics-server port (--enable-metrics): no effect (logged)."),
]
PromptTokensDetailsOpt = Annotated[
    bool,
    vllm_option(
        "--enable-prompt-tokens-details",
        help="No effect (logged): usage.prompt_tokens_details.cached_tokens is always reported.",
    ),
]
ForceIncludeUsageOpt = Annotated[
    bool,
    vllm_option(
        "--enable-force-include-usage",
        help="No effect (logged): every response carries usage (run-batch does not stream).",
    ),
]

METRICS_REFUSED = (
    "--enable-metrics is not supported by fd run-batch: it serves no HTTP; the run's counters (lines, "
    "tokens, tokens/s) are in the summary on stderr and in --summary-json FILE; for Prometheus metrics "
    "run the requests through `fd serve` and scrape its /metrics"
)


def vllm_batch_notes(
    output_tmp_dir: str | None,
    max_log_len: int | None,
    url: str | None,
    port: int | None,
    prompt_tokens_details: bool,
    force_include_usage: bool,
) -> list[str]:
    """One line for each of vLLM's run-batch flags that was given and changes nothing here, and why."""
    notes = []
    if output_tmp_dir is not None:
        notes.append(
            "--output-tmp-dir has no effect: fd writes the output to a local file (as OUT.partial beside it, "
            "renamed when done) and uploads nothing to a URL"
        )
    if max_log_len is not None:
        notes.append("--max-log-len has no effect: fd logs no prompts or prompt token ids")
    for flag, value in (("--url", url), ("--port", port)):
        if value is not None:
            notes.append(
                f"{flag} has no effect: it places vLLM's metrics server (--enable-metrics), which fd "
                "run-batch does not have; see the summary (--summary-json)"
            )
    if prompt_tokens_details:
        notes.append(
            "--enable-prompt-tokens-details has no effect: fd always reports "
            "usage.prompt_tokens_details.cached_tokens"
        )
    if force_include_usage:
        notes.append(
            "--enable-force-include-usage has no effect: every run-batch response carries usage (lines "
            "cannot stream)"
        )
    return notes


@engine_options
def run_batch(
    input: InputOpt,
    output: OutputOpt,
    strict: StrictOpt = False,
    resume: ResumeOpt = False,
    summary_json: SummaryJsonOpt = None,
    max_inflight: MaxInflightOpt = None,
    chat_template: ChatTemplateOpt = None,
    reasoning_parser: ReasoningParserOpt = None,
    tool_call_parser: ToolCallParserOpt = None,
    allowed_local_media_path: AllowedLocalMediaOpt = None,
    allowed_media_domains: AllowedMediaDomainsOpt = None,
    limit_mm_per_prompt: LimitMmOpt = None,
    progress: ProgressOpt = True,
    response_role: ResponseRoleOpt = None,
    output_tmp_dir: OutputTmpDirOpt = None,
    max_log_len: MaxLogLenOpt = None,
    enable_metrics: EnableMetricsOpt = False,
    url: MetricsUrlOpt = None,
    port: MetricsPortOpt = None,
    enable_prompt_tokens_details: PromptTokensDetailsOpt = False,
    enable_force_include_usage: ForceIncludeUsageOpt = False,
    *,
    engine_args: dict,
) -> None:
    """Run an OpenAI Batch-format JSONL file through the engine without a server, results in input order."""
    if enable_metrics:
        fail(METRICS_REFUSED, EXIT_USAGE)
    in_path = None if input == "-" else Path(input)
    out_path = None if output == "-" else Path(output)
    if in_path is not None and not in_path.is_file():
        fail(f"input file {input!r} does not exist or is not a file", EXIT_USAGE)
    if out_path is not None and out_path.is_dir():
        fail(f"the output {output!r} is a folder; give a file name", EXIT_USAGE)
    if out_path is not None and not out_path.parent.is_dir():
        fail(f"the folder of the output file {output!r} does not exist", EXIT_USAGE)
    if resume and out_path is None:
        fail("--resume needs an output file (-o FILE), not stdout", EXIT_USAGE)

    notes = vllm_batch_notes(
        output_tmp_dir, max_log_len, url, port, enable_prompt_tokens_details, enable_force_include_usage
    )
    for note in notes:
        logging.getLogger("fd.batch").warning(note)

    from rich.console import Console

    with error_boundary():
        from fdcli_engine.config import EngineConfig
        from fdcli_engine.entrypoints.batch import BatchOptions
        from fdcli_engine.entrypoints.batch import run_batch as run
        from fdcli_engine.entrypoints.openai.serving_options import ServingOptions, load_chat_template

        opts = BatchOptions(
            input=in_path,
            output=out_path,
            strict=strict,
            resume=resume,
            max_inflight=max_inflight,
            progress=progress and Console(stderr=True).is_terminal,
            summary_json=summary_json,
            serving=ServingOptions(
                served_model_names=EngineConfig.from_dict(engine_args).served_model_names or None,
                chat_template=load_chat_template(chat_template),
                reasoning_parser=reasoning_parser,
                tool_call_parser=tool_call_parser,
                allowed_local_media_path=allowed_local_media_path,
                allowed_media_domains=allowed_media_domains,
                limit_mm_per_prompt=limit_mm_per_prompt,
                response_role=response_role or "assistant",
            ),
        )
        summary = run(opts, engine_args)
    for line in summary.lines():
        sys.stderr.write(line + "\n")
    if summary.message:
        sys.stderr.write(f"Error: {summary.message}\n")
    if summary.status != "completed":
        raise typer.Exit(EXIT_LINES_FAILED)
