"""`fd serve`: placeholder until the server engineer replaces this module (same function name)."""

from __future__ import annotations

from fdcli.console import fail
from fdcli.options import engine_options


@engine_options
def serve(*, engine_args: dict) -> None:
    """Serve a model over an OpenAI-compatible HTTP API (not implemented yet)."""
    fail("`fd serve` is not implemented yet")
