"""Run summary (counts, tokens, wall time) and the Rich progress bar on stderr."""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path


@dataclass
class BatchSummary:
    total: int = 0  # non-blank input lines
    succeeded: int = 0
    failed: int = 0
    skipped: int = 0  # already in the output (--resume)
    skipped_failed: int = 0  # of those, error records: the output as a whole still has failures
    retried: int = 0  # lines run again after the engine (data-parallel rank, Ray actor) holding them died
    prompt_tokens: int = 0
    completion_tokens: int = 0
    wall_time_s: float = 0.0
    output: str | None = None
    status: str = "running"  # "completed" | "lines_failed" | "stopped" | "failed"
    message: str | None = None  # why the run stopped or failed
    started_at: float = field(default_factory=time.time)

    @property
    def done(self) -> int:
        return self.succeeded + self.failed + self.skipped

    @property
    def output_tokens_per_s(self) -> float:
        return self.completion_tokens / self.wall_time_s if self.wall_time_s > 0 else 0.0

    @property
    def total_tokens_per_s(self) -> float:
        tokens = self.prompt_tokens + self.completion_tokens
        return tokens / self.wall_time_s if self.wall_time_s > 0 else 0.0

    def to_dict(self) -> dict:
        d = asdict(self)
        d["output_tokens_per_s"] = round(self.output_tokens_per_s, 2)
        d["total_tokens_per_s"] = round(self.total_tokens_per_s, 2)
        d["wall_time_s"] = round(self.wall_time_s, 3)
        return d

    def write_json(self, path: Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=2) + "\n", encoding="utf-8")

    def lines(self) -> list[str]:
        return [
            f"fd run-batch: {self.status}: {self.total} lines, {self.succeeded} succeeded, "
            f"{self.failed} failed, {self.skipped} skipped (already done"
            + (f", {self.skipped_failed} of them failed)" if self.skipped_failed else ")"),
            *(
                [f"  {self.retried} line(s) retried after the engine running them failed"]
                if self.retried
                else []
            ),
            f"  tokens: {self.prompt_tokens} in, {self.completion_tokens} out in {self.wall_time_s:.1f} s "
            f"({self.output_tokens_per_s:.1f} output tok/s, {self.total_tokens_per_s:.1f} total tok/s)",
        ]


class BatchProgress:
    """A transient Rich progress bar: lines done / total, output tok/s, elapsed and ETA."""

    def __init__(self, total: int, console=None):
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        self._console = console or Console(stderr=True)
        self._p = Progress(
            TextColumn("run-batch"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[tok_s]:.1f} tok/s"),
            TimeElapsedColumn(),
            TextColumn("ETA"),
            TimeRemainingColumn(),
            console=self._console,
            transient=True,
        )
        self._task = self._p.add_task("lines", total=total, tok_s=0.0)
        self._t0 = time.perf_counter()
        self._p.start()

    def advance(self, summary: BatchSummary) -> None:
        elapsed = time.perf_counter() - self._t0
        tok_s = summary.completion_tokens / elapsed if elapsed > 0 else 0.0
        self._p.update(self._task, completed=summary.done, tok_s=tok_s)

    def close(self) -> None:
        self._p.stop()
