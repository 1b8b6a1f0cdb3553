"""`fd run-batch`: an OpenAI Batch-format JSONL file through `fd serve`'s serving layer, without HTTP
(the engine core runs in a child process, as under `fd serve`; it is stopped however the run ends).

Exit codes: 0 every line succeeded; 3 the run finished but some lines failed (each has an error record)
or --strict stopped it; 2 bad options or input (e.g. duplicate custom_ids, found before the model
loads); 1 the run itself failed (engine error, I/O); 130 interrupted by Ctrl-C or SIGTERM (OUT.partial
is kept for --resume). Engine internals load inside the command only.
"""

from __future__ import annotations

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
    ToolCallParserOpt,
    engine_options,
)

EXIT_LINES_FAILED = (
    3  # mirrors fdcli_engine.entrypoints.batch.EXIT_LINES_FAILED (not imported: paddle-free CLI)
)

InputOpt = Annotated[
    str, typer.Option("--input", "-i", help="Input JSONL file in the OpenAI Batch format; '-' reads stdin.")
]
OutputOpt = Annotated[
    str,
    typer.Option(
        "--output", "-o", help="Output JSONL file (written as OUT.partial, renamed when done); '-' is stdout."
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
    *,
    engine_args: dict,
) -> None:
    """Run an OpenAI Batch-format JSONL file through the engine without a server, results in input order."""
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
            ),
        )
        summary = run(opts, engine_args)
    for line in summary.lines():
        sys.stderr.write(line + "\n")
    if summary.message:
        sys.stderr.write(f"Error: {summary.message}\n")
    if summary.status != "completed":
        raise typer.Exit(EXIT_LINES_FAILED)
