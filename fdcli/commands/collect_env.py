"""`fd collect-env`: environment report for bug reports."""

from __future__ import annotations


def collect_env() -> None:
    """Print the environment (OS, CPU, Python, Paddle, packages, env vars) for bug reports."""
