"""`fd run-batch`: OpenAI Batch-format JSONL through the engine in this process.

    summary = run_batch(BatchOptions(input=Path("in.jsonl"), output=Path("out.jsonl")), engine_args)

Order of work (each step fails before the next costs anything):
1. stdin is spooled to a temp file (two passes need to re-read it);
2. first pass: duplicate custom_ids → DuplicateIdsError, before the model is loaded;
3. OUT.partial is prepared (--resume keeps what is there);
4. the engine is loaded and the lines run; OUT.partial is renamed to OUT once every line has a record.

Exit codes (the CLI maps outcomes to them; documented in docs/run-batch.md):
EXIT_OK 0 every line succeeded · EXIT_RUN_FAILED 1 the run failed (engine, I/O) · EXIT_USAGE 2 bad
options or input (duplicate ids) · EXIT_LINES_FAILED 3 the run finished but some lines failed, or
--strict stopped it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fdcli_engine.entrypoints.batch.files import (
    BatchFileError,
    DuplicateIdsError,
    OutputWriter,
    partial_path,
    prepare_output,
    scan_input,
    spool_stdin,
)
from fdcli_engine.entrypoints.batch.summary import BatchProgress, BatchSummary

EXIT_OK = 0
EXIT_RUN_FAILED = 1
EXIT_USAGE = 2
EXIT_LINES_FAILED = 3

__all__ = [
    "EXIT_LINES_FAILED",
    "EXIT_OK",
    "EXIT_RUN_FAILED",
    "EXIT_USAGE",
    "BatchFileError",
    "BatchOptions",
    "BatchSummary",
    "DuplicateIdsError",
    "run_batch",
]


@dataclass
class BatchOptions:
    input: Path | None  # None: stdin
    output: Path | None  # None: stdout (no partial file, no resume)
    strict: bool = False
    resume: bool = False
    max_inflight: int | None = None  # None: 2 × max_num_seqs
    progress: bool = True
    chat_template: str | None = None
    reasoning_parser: str | None = None  # as `fd serve --reasoning-parser`
    summary_json: Path | None = None  # also write the summary here (every outcome, "failed" included)


def _default_engine(engine_args: dict[str, Any]):
    from fdcli_engine.api.inproc_client import InProcessEngineClient
    from fdcli_engine.config import EngineConfig
    from fdcli_engine.entrypoints.openai.api_server import default_served_name

    config = EngineConfig.from_dict(engine_args, source="options").finalize()
    # The same default name as `fd serve`, so a body's "model" that works there works here.
    return InProcessEngineClient(
        config, served_model_name=config.served_model_name or default_served_name(config)
    )


def run_batch(
    opts: BatchOptions,
    engine_args: dict[str, Any] | None = None,
    engine_factory: Callable[[dict[str, Any]], Any] | None = None,
) -> BatchSummary:
    """Run the batch; returns the summary (status "completed", "lines_failed" or "stopped").

    Raises DuplicateIdsError / BatchFileError before any model work, BatchRunError if the engine dies.
    `engine_factory(engine_args)` returns an EngineClient (tests inject fakes).
    """
    if opts.output is not None and opts.input is not None and opts.output.resolve() == opts.input.resolve():
        raise BatchFileError("the output file must not be the input file")
    if opts.resume and opts.output is None:
        raise BatchFileError("--resume needs an output file (-o FILE), not stdout")
    from fdcli_engine.entrypoints.openai.reasoning import get_parser_cls

    get_parser_cls(opts.reasoning_parser)  # an unknown parser is a ConfigError now, not after the load
    spooled = spool_stdin() if opts.input is None else None
    path = spooled or opts.input
    try:
        try:
            scan = scan_input(path)
        except OSError as e:
            raise BatchFileError(f"cannot read the input {str(path)!r}: {e.strerror or e}") from None
        done_keys, _ = prepare_output(opts.output, opts.resume) if opts.output is not None else ({}, 0)
        # Only now, with the input checked and the output writable, is the model loaded.
        try:
            engine = (engine_factory or _default_engine)(dict(engine_args or {}))
        except BaseException:
            _drop_empty_partial(opts.output)
            raise
        return asyncio.run(_run(opts, engine, path, scan.num_lines, done_keys))
    finally:
        if spooled is not None:
            spooled.unlink(missing_ok=True)


def _drop_empty_partial(out: Path | None) -> None:
    """A run that never started leaves no empty OUT.partial behind (one with records is kept)."""
    if out is None:
        return
    part = partial_path(out)
    if part.exists() and part.stat().st_size == 0:
        part.unlink()


async def _run(opts: BatchOptions, engine, path: Path, num_lines: int, done_keys: dict) -> BatchSummary:
    from fdcli_engine.entrypoints.batch.runner import BatchRunner, Serving, StrictStop

    window = opts.max_inflight or 2 * int(getattr(getattr(engine, "config", None), "max_num_seqs", 0) or 32)
    serving = Serving(
        engine, [engine.model_config.served_model_name], opts.chat_template, opts.reasoning_parser
    )
    writer = OutputWriter(opts.output)
    progress = BatchProgress(num_lines) if opts.progress else None
    runner = BatchRunner(serving, writer, window, done_keys=done_keys, strict=opts.strict, progress=progress)
    summary = runner.summary
    summary.total = num_lines
    summary.output = str(opts.output) if opts.output is not None else "-"
    t0 = time.perf_counter()
    try:
        await runner.run(path)
        # "completed" means every record in the output succeeded, resumed ones included.
        clean = summary.failed == 0 and summary.skipped_failed == 0
        summary.status = "completed" if clean else "lines_failed"
        summary.wall_time_s = time.perf_counter() - t0
        writer.commit()
    except StrictStop as e:
        summary.status = "stopped"
        summary.message = str(e)
    except OSError as e:  # disk full, output folder removed mid-run: results so far stay in OUT.partial
        summary.status, summary.message = "failed", f"writing the output failed: {e.strerror or e}"
        raise BatchFileError(summary.message) from None
    except BaseException as e:
        summary.status, summary.message = "failed", str(e) or type(e).__name__
        raise
    finally:
        summary.wall_time_s = time.perf_counter() - t0
        writer.close()
        if progress is not None:
            progress.close()
        if opts.summary_json is not None:  # written however the run ended
            summary.write_json(opts.summary_json)
        shutdown = getattr(engine, "shutdown", None)
        if shutdown is not None:
            await shutdown()
    return summary
