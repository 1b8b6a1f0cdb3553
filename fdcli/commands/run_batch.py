"""`fd run-batch`: placeholder until the batch engineer replaces this module (same function name)."""

from __future__ import annotations

from fdcli.console import fail
from fdcli.options import engine_options


@engine_options
def run_batch(*, engine_args: dict) -> None:
    """Run an OpenAI Batch-format JSONL file through the engine in-process (not implemented yet)."""
    fail("`fd run-batch` is not implemented yet")
