"""vLLM's argparse spellings for `fd bench serve`, read by a Click command before it parses.

vLLM declares `--goodput` as nargs="+" and `--metadata`/`--header` as nargs="*" (`--goodput ttft:300
tpot:50`), and `--save-result` as a flag. Click has no multi-value options, so the command rewrites
argv first: every bare word after one of those options becomes one more use of it, and fd's older
`--save-result FILE` becomes `--save-result --result-filename FILE`. The rewrite is unambiguous
because `fd bench serve` takes no positional arguments: a bare word there is otherwise an error.

Imports click/typer only: this module loads with `fd --help`.
"""

from __future__ import annotations

from typer.core import TyperCommand

MULTI_VALUE_OPTIONS = ("--goodput", "--metadata", "--header")
SAVE_RESULT = "--save-result"
RESULT_FILENAME = "--result-filename"


def _is_value(token: str) -> bool:
    return not token.startswith("-")


def rewrite_vllm_args(args: list[str]) -> list[str]:
    """argv with vLLM's multi-value options and fd's `--save-result FILE` in Click's one-value form."""
    out: list[str] = []
    repeat: str | None = None  # the multi-value option whose values are being read
    i = 0
    while i < len(args):
        token = args[i]
        i += 1
        if token == "--":
            out.extend(args[i - 1 :])
            break
        name, eq, value = token.partition("=")
        if name == SAVE_RESULT:
            repeat = None
            out.append(SAVE_RESULT)
            if eq:
                out += [RESULT_FILENAME, value]
            elif i < len(args) and _is_value(args[i]):
                out += [RESULT_FILENAME, args[i]]
                i += 1
            continue
        if name in MULTI_VALUE_OPTIONS:
            repeat = name
            out.append(token)
            if not eq and i < len(args):
                out.append(args[i])  # its first value, whatever it looks like (Click reads it so)
                i += 1
            continue
        if repeat is not None and _is_value(token):
            out += [repeat, token]
            continue
        repeat = None
        out.append(token)
    return out


class VllmArgsCommand(TyperCommand):
    """A Typer command that accepts vLLM's multi-value spellings (see the module docstring)."""

    def parse_args(self, ctx, args: list[str]) -> list[str]:
        return super().parse_args(ctx, rewrite_vllm_args(list(args)))
