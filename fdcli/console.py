"""Shared Rich consoles and the error boundary every command uses.

Invariants:
- Results go to stdout (`console`), diagnostics to stderr (`err_console`), so `fd ... --json | jq` works.
- A domain error (`fdcli_engine.errors.FdError`) or a transport error of httpx becomes exactly one line on
  stderr and a non-zero exit, never a traceback:
    exit 2: the user's input is wrong (ConfigError, InvalidRequestError, BadInput) — like click's usage errors;
    exit 1: the input was fine but something failed (model load, kernel build, server unreachable).
- A usage error of click (unknown option, bad value type, extra argument) is one line as well, exit 2:
  `FdGroup`, the root group's class, catches it for every command below it; `--help` and a bare
  command group (which prints its help) are left as click shows them.
- This module imports only rich.console and fd's leaf error module, so `fd --help` stays fast; httpx is
  never imported here (an httpx error can only exist if a command already imported httpx).
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, NoReturn, TypeVar

import typer
from rich.console import Console
from typer.core import TyperGroup

from fdcli_engine.errors import ConfigError, FdError, InvalidRequestError

try:  # Typer >= 0.29 parses with its own copy of click; earlier ones with click itself
    from typer._click import exceptions as click_errors
except ImportError:  # pragma: no cover - depends on the installed Typer
    from click import exceptions as click_errors

console = Console(soft_wrap=True)
err_console = Console(stderr=True, soft_wrap=True)

EXIT_FAILURE = 1
EXIT_USAGE = 2

F = TypeVar("F", bound=Callable[..., Any])


class BadInput(FdError):
    """A CLI argument that parsed as text but is not valid (e.g. a token id that is not an integer)."""


def one_line(message: object) -> str:
    """Collapse a message to a single line: the CLI contract is one line per error on stderr."""
    return " ".join(str(message).split()) or "unknown error"


def fail(message: object, code: int = EXIT_FAILURE) -> NoReturn:
    """Print `Error: <message>` as one plain line on stderr and exit with `code`."""
    # Plain write, not Rich: Rich would wrap long messages at the terminal width and interpret [markup].
    sys.stderr.write(f"Error: {one_line(message)}\n")
    sys.stderr.flush()
    raise typer.Exit(code)


def exit_code_for(exc: BaseException) -> int:
    return EXIT_USAGE if isinstance(exc, (ConfigError, InvalidRequestError, BadInput)) else EXIT_FAILURE


def _httpx_message(exc: BaseException) -> str | None:
    """A user message for httpx transport/status errors, or None when `exc` is not one."""
    httpx = sys.modules.get("httpx")
    if httpx is None:
        return None
    if isinstance(exc, httpx.TimeoutException):
        return f"request to the server timed out ({type(exc).__name__})"
    if isinstance(exc, httpx.TransportError):
        url = ""
        try:
            url = f" at {exc.request.url}"
        except RuntimeError:  # the request property raises when the error carries no request
            pass
        return f"cannot reach the server{url}: {exc}"
    if isinstance(exc, httpx.HTTPStatusError):
        return f"server answered {exc.response.status_code}: {exc.response.text[:300]}"
    return None


@contextmanager
def error_boundary() -> Iterator[None]:
    """Turn FdError / httpx errors raised inside the block into one stderr line and an exit code."""
    try:
        yield
    except FdError as exc:
        fail(exc, exit_code_for(exc))
    except KeyboardInterrupt:
        sys.stderr.write("Aborted.\n")
        raise typer.Exit(130) from None
    except Exception as exc:
        msg = _httpx_message(exc)
        if msg is None:
            raise
        fail(msg, EXIT_FAILURE)


def cli_errors(func: F) -> F:
    """Decorator form of `error_boundary` for command functions (keeps the signature for Typer)."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with error_boundary():
            return func(*args, **kwargs)

    return wrapper  # type: ignore[return-value]


@contextmanager
def _one_line_usage_errors() -> Iterator[None]:
    try:
        yield
    except click_errors.NoArgsIsHelpError:
        raise  # `fd` or `fd bench` alone: click prints the help, as before
    except click_errors.ClickException as exc:
        hint = ""
        ctx = getattr(exc, "ctx", None)
        if isinstance(exc, click_errors.UsageError) and ctx is not None:
            hint = f" (see {ctx.command_path} --help)"
        fail(f"{exc.format_message()}{hint}", exc.exit_code)


class FdGroup(TyperGroup):
    """The root `fd` group: click's usage errors of any command below it as one `Error: ...` line on
    stderr (typer would print a Rich box of five lines), with click's exit code (2 for usage)."""

    def make_context(self, *args: Any, **kwargs: Any) -> typer.Context:
        with _one_line_usage_errors():
            return super().make_context(*args, **kwargs)

    def invoke(self, ctx: typer.Context) -> Any:
        with _one_line_usage_errors():
            return super().invoke(ctx)
