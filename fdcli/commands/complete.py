"""`fd complete`: placeholder until the client engineer replaces this module (same function name)."""

from __future__ import annotations

from fdcli.console import fail


def complete() -> None:
    """Send one completion request to an OpenAI-compatible server (not implemented yet)."""
    fail("`fd complete` is not implemented yet")
