"""`fd run-batch`: OpenAI Batch-format JSONL through the serving layer of `fd serve`, without HTTP.

    summary = run_batch(BatchOptions(input=Path("in.jsonl"), output=Path("out.jsonl")), engine_args)

Order of work (each step fails before the next costs anything):
1. stdin is spooled to a temp file (two passes need to re-read it);
2. first pass: duplicate custom_ids → DuplicateIdsError, before the model is loaded;
3. OUT.partial is prepared (--resume keeps what is there);
4. the engine is loaded and the lines run; OUT.partial is renamed to OUT once every line has a record.

The engine is the server's `AsyncLLM`: the engine core steps in its own process while this one parses
lines, renders prompts, detokenizes and writes records, so that work overlaps the model's steps instead
of sitting between them (in-process, even with step() on a worker thread, the step's Python and the
serving work share one GIL: docs/engine-measurements.md).
The front end owns shutdown: however the run ends (done, error, Ctrl-C, SIGTERM) the core is told to
stop and is reaped before `run_batch` returns or raises; SIGTERM stops the run as Ctrl-C does, even
in a background job that inherited SIGINT ignored (sigterm.py).

Exit codes (the CLI maps outcomes to them; documented in docs/run-batch.md):
EXIT_OK 0 every line succeeded · EXIT_RUN_FAILED 1 the run failed (engine, I/O) · EXIT_USAGE 2 bad
options or input (duplicate ids) · EXIT_LINES_FAILED 3 the run finished but some lines failed, or
--strict stopped it · 130 interrupted (the CLI's KeyboardInterrupt exit).
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
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
from fdcli_engine.entrypoints.batch.sigterm import SigtermStop, keep_sigterm_handler
from fdcli_engine.entrypoints.batch.summary import BatchProgress, BatchSummary
from fdcli_engine.entrypoints.openai.serving_options import (
    ServingOptions,
    check_serving_options,
    default_served_name,
)

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
    summary_json: Path | None = None  # also write the summary here (every outcome, "failed" included)
    serving: ServingOptions = field(default_factory=ServingOptions)  # as `fd serve`'s


def _default_engine(engine_args: dict[str, Any]):
    """The server's engine client; its core process starts (and loads the model) in `_start_engine`.
    A bad option or missing model fails here, in `resolve_config()`, before any process starts."""
    from fdcli_engine.api.async_llm import AsyncLLM
    from fdcli_engine.config import EngineConfig
    from fdcli_engine.config_resolver import resolve_config
    from fdcli_engine.threads import import_paddle
    from fdcli_engine.tokenizer import load_tokenizer

    keep_sigterm_handler(import_paddle)  # resolve_config() would import it, with paddle's handler
    config = resolve_config(EngineConfig.from_dict(engine_args, source="options"))
    if config.node_rank > 0:
        from fdcli_engine.errors import ConfigError

        raise ConfigError(
            f"--node-rank {config.node_rank} only serves its tensor-parallel ranks: start that node with "
            "fd serve (node 0 runs the batch)"
        )
    # The same default name as `fd serve`, so a body's "model" that works there works here.
    name = config.served_model_name or default_served_name(config)
    # stdout may be the output (`-o -`): the core's stray prints go to stderr (fd 2).
    return AsyncLLM(config, load_tokenizer(config), served_model_name=name, core_stdout=2)


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
    check_serving_options(opts.serving)  # an unknown parser: ConfigError now, not after the load
    on_ray = engine_factory is None and (engine_args or {}).get("distributed_executor_backend") == "ray"
    if on_ray:
        from fdcli_engine.entrypoints.batch.ray_driver import import_ray

        import_ray()  # Ray missing: one ConfigError line, before stdin is read or anything loads
    stop = SigtermStop()
    previous_sigterm = stop.install()
    spooled = None
    try:
        spooled = spool_stdin() if opts.input is None else None
        path = spooled or opts.input
        try:
            scan = scan_input(path)
        except OSError as e:
            raise BatchFileError(f"cannot read the input {str(path)!r}: {e.strerror or e}") from None
        done_keys, _ = prepare_output(opts.output, opts.resume) if opts.output is not None else ({}, 0)
        # Only now, with the input checked and the output writable, is the model loaded.
        try:
            if on_ray:
                from fdcli_engine.entrypoints.batch.ray_driver import run_on_ray

                main = run_on_ray(opts, dict(engine_args or {}), path, scan.num_lines, done_keys, stop)
            else:
                engine = (engine_factory or _default_engine)(dict(engine_args or {}))
                stop.install()  # again: an engine factory may have replaced it
                main = _run(opts, engine, path, scan.num_lines, done_keys, stop)
            try:
                return asyncio.run(main)
            except asyncio.CancelledError:
                if stop.count:  # our SIGTERM cancelled the run: the same exit as Ctrl-C
                    raise KeyboardInterrupt from None
                raise
        except BaseException:
            _drop_empty_partial(opts.output)
            raise
    finally:
        if spooled is not None:
            spooled.unlink(missing_ok=True)
        if previous_sigterm is not None:
            signal.signal(signal.SIGTERM, previous_sigterm)


def _drop_empty_partial(out: Path | None) -> None:
    """A run that fails or is interrupted before its first record leaves no empty OUT.partial behind
    (one with records is kept for --resume)."""
    if out is None:
        return
    part = partial_path(out)
    if part.exists() and part.stat().st_size == 0:
        part.unlink()


async def _run(
    opts: BatchOptions, engine, path: Path, num_lines: int, done_keys: dict, stop: SigtermStop
) -> BatchSummary:
    """Start the engine, run the lines, and stop the engine however that ends."""
    stop.watch()
    try:
        await _start_engine(engine)
        return await _run_lines(opts, engine, path, num_lines, done_keys)
    finally:
        if engine.was_ready:
            await engine.shutdown()  # AsyncLLM: Shutdown to the core, then terminate/kill, then reap
        else:  # interrupted (or failed) while the core loads: nothing to drain, do not wait for the load
            await engine.shutdown(timeout=0.0)


async def _start_engine(engine) -> None:
    """Start the engine (AsyncLLM: its core process) and wait for the model. A core that fails to
    load is a BatchRunError (exit 1), with the core's reason."""
    from fdcli_engine.entrypoints.batch.dispatcher import BatchRunError

    await engine.start()
    await engine.ready_event.wait()
    if engine.is_dead:
        raise BatchRunError(" ".join(str(engine.dead_reason).split()))


async def _run_lines(opts: BatchOptions, engine, path: Path, num_lines: int, done_keys: dict) -> BatchSummary:
    from fdcli_engine.entrypoints.batch.dispatcher import BatchDispatcher
    from fdcli_engine.entrypoints.openai.serving_layer import build_serving

    window = opts.max_inflight or 2 * int(engine.config.max_num_seqs or 32)
    serving = build_serving(engine, opts.serving)

    def make(writer: OutputWriter, progress: BatchProgress | None):
        return BatchDispatcher(
            serving, writer, window, done_keys=done_keys, strict=opts.strict, progress=progress
        )

    return await run_dispatcher(opts, path, num_lines, make)


async def run_dispatcher(opts: BatchOptions, path: Path, num_lines: int, make_dispatcher) -> BatchSummary:
    """Run the lines through `make_dispatcher(writer, progress)` and finish the output and the summary
    however that ends: OUT.partial renamed to OUT only when every line has a record."""
    from fdcli_engine.entrypoints.batch.dispatcher import StrictStop

    writer = OutputWriter(opts.output)
    progress = BatchProgress(num_lines) if opts.progress else None
    dispatcher = make_dispatcher(writer, progress)
    summary = dispatcher.summary
    summary.total = num_lines
    summary.output = str(opts.output) if opts.output is not None else "-"
    t0 = time.perf_counter()
    try:
        await dispatcher.run(path)
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
    except asyncio.CancelledError:  # Ctrl-C or SIGTERM: asyncio cancelled the run
        summary.status, summary.message = "failed", "interrupted"
        raise
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
    return summary
