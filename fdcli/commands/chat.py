"""`fd chat`: placeholder until the client engineer replaces this module (same function name)."""

from __future__ import annotations

from fdcli.console import fail


def chat() -> None:
    """Chat interactively with an OpenAI-compatible server (not implemented yet)."""
    fail("`fd chat` is not implemented yet")
