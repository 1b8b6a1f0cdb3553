"""`fd tokenizer`: the model's tokenizer and chat template, offline."""

from __future__ import annotations

import typer

app = typer.Typer(
    help="Encode, decode and inspect a model's tokenizer and chat template (offline).", no_args_is_help=True
)
