"""The `fd` command-line entry point (console script `fd = fdcli.main:main`).

Import discipline: this module and every command module import only typer, rich.console and fd's leaf
modules at top level; paddle and engine internals load inside the command that needs them, so
`fd --help` is instant. tests/cli/test_cli_import.py holds this.
"""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from fdcli.commands import chat, collect_env, complete, router, run_batch, serve
from fdcli.commands.tokenizer import app as tokenizer_app
from fdcli.console import FdGroup
from fdcli.options import EngineCommand

app = typer.Typer(
    name="fd",
    cls=FdGroup,  # usage errors of every command: one line on stderr (fdcli.console)
    help="fd: deploy large language models on PaddlePaddle — serve, chat, bench, batch.",
    no_args_is_help=True,
    context_settings={"help_option_names": ["-h", "--help"]},
    add_completion=False,
    pretty_exceptions_enable=False,  # domain errors are handled per command; anything else is a bug
)


def _version_callback(value: bool) -> None:
    if value:
        from importlib.metadata import PackageNotFoundError, version

        try:
            typer.echo(f"fd {version('fd-llm')}")
        except PackageNotFoundError:
            typer.echo("fd (not installed)")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        Optional[bool],
        typer.Option("--version", "-V", callback=_version_callback, is_eager=True, help="Show the version."),
    ] = None,
) -> None:
    """fd: deploy large language models on PaddlePaddle — serve, chat, bench, batch."""


app.command("serve", cls=EngineCommand)(serve.serve)
app.command("chat")(chat.chat)
app.command("complete")(complete.complete)
app.command("run-batch", cls=EngineCommand)(run_batch.run_batch)
app.command("router")(router.router)
app.add_typer(tokenizer_app, name="tokenizer")
app.command("collect-env")(collect_env.collect_env)


def _mount_bench() -> None:
    # The bench command group is owned by another module; a missing module must not break `fd`.
    try:
        from fdcli.commands.bench import app as bench_app
    except ModuleNotFoundError as exc:
        if exc.name not in ("fdcli.commands.bench", "fdcli.bench"):
            raise
        return
    app.add_typer(bench_app, name="bench")


_mount_bench()


def main() -> None:
    app(prog_name="fd")


if __name__ == "__main__":
    main()
