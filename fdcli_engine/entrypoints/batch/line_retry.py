"""The one rule for a line whose engine died under it (a Ray actor's, a data-parallel rank's): it runs
again on another engine, on at most MAX_ATTEMPTS engines in all; after that it gets an error record
instead, so a line that kills every engine it reaches costs the run that line, not every engine."""

from __future__ import annotations

from fdcli_engine.entrypoints.batch.records import BatchLine, error_record

MAX_ATTEMPTS = 2  # the first engine, then one retry on another


def gave_up(line: BatchLine, attempts: int, engines: str, code: str, reason: str) -> dict | None:
    """After `attempts` engines died holding `line`: None while it may run again elsewhere, else its
    error record (`code`; the message names the `engines` and the last one's `reason`)."""
    if attempts < MAX_ATTEMPTS:
        return None
    message = f"the {engines} running this line failed {attempts} times; last: {reason}"
    return error_record(line.line_no, line.custom_id, code, message)
