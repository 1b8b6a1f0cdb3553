"""`fd tokenizer`: the model's tokenizer and chat template, offline (no engine, no paddle).

Every subcommand takes --model/--tokenizer (default: the installed SmolLM2 GGUF). Raw results (ids,
decoded text, rendered prompts) are written with typer.echo, never through Rich, so text containing
`[brackets]` is printed verbatim and output can be piped.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from fdcli.console import BadInput, cli_errors, console
from fdcli.options import ModelOpt, TokenizerOpt

app = typer.Typer(
    help="Encode, decode and inspect a model's tokenizer and chat template (offline).",
    no_args_is_help=True,
)

JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON.")]
NoSpecialOpt = Annotated[
    bool, typer.Option("--no-special", help="Do not add the model's special tokens (e.g. BOS).")
]
TextArg = Annotated[str, typer.Argument(help="Text to tokenize; '-' reads standard input.")]

# Alternating styles that mark token boundaries in `encode --show`.
_SHOW_STYLES = (
    "black on bright_cyan",
    "black on bright_yellow",
    "black on bright_green",
    "black on bright_magenta",
)


def _load(model: str | None, tokenizer: str | None):
    from fdcli_engine.tokenizer import load_tokenizer

    return load_tokenizer(tokenizer or model)


def _read_stdin(what: str) -> str:
    if sys.stdin.isatty():  # waiting on a terminal would look like a hang
        raise BadInput(
            f"'-' reads {what} from standard input: pipe it in, e.g. `echo ... | fd tokenizer ...`"
        )
    return sys.stdin.read()


def _read_text(text: str) -> str:
    return _read_stdin("the text") if text == "-" else text


def parse_ids(values: list[str]) -> list[int]:
    """Token ids from `1 2 3`, `1,2,3` or `[1, 2, 3]` (one or several arguments). Never evaluates input."""
    joined = " ".join(values).strip()
    if joined.startswith("[") and joined.endswith("]"):
        joined = joined[1:-1]
    pieces = [p for p in re.split(r"[\s,]+", joined) if p]
    if not pieces:
        raise BadInput("no token ids given: pass ids like `1 2 3`, `1,2,3` or `[1, 2, 3]`")
    ids = []
    for piece in pieces:
        if not re.fullmatch(r"[+-]?\d+", piece):
            raise BadInput(
                f"token id {piece!r} is not an integer: pass ids like `1 2 3`, `1,2,3` or `[1, 2, 3]`"
            )
        ids.append(int(piece))
    return ids


def _show_piece(tok: Any, token_id: int) -> str:
    """A token as displayed by --show: its text, or its bytes in hex when it holds part of a character."""
    piece = tok.decode([token_id], skip_special_tokens=False)
    if "\ufffd" in piece:
        piece = "<" + tok.token_bytes(token_id).hex(" ").upper() + ">"
    return piece.replace("\n", "\\n").replace("\t", "\\t").replace("\r", "\\r")


@app.command()
@cli_errors
def encode(
    text: TextArg,
    show: Annotated[bool, typer.Option("--show", help="Show the tokens, coloured by boundary.")] = False,
    json_out: JsonOpt = False,
    no_special: NoSpecialOpt = False,
    model: ModelOpt = None,
    tokenizer: TokenizerOpt = None,
) -> None:
    """Encode TEXT into token ids."""
    tok = _load(model, tokenizer)
    ids = tok.encode(_read_text(text), add_special_tokens=not no_special)
    if json_out:
        typer.echo(
            json.dumps(
                {"ids": ids, "tokens": tok.convert_ids_to_tokens(ids), "count": len(ids)}, ensure_ascii=False
            )
        )
        return
    if show:
        from rich.text import Text

        line = Text()
        for n, i in enumerate(ids):
            line.append(
                _show_piece(tok, i),
                style=_SHOW_STYLES[n % len(_SHOW_STYLES)],
            )
        console.print(line)
        console.print(f"{len(ids)} tokens", style="dim", highlight=False)
        return
    typer.echo(json.dumps(ids))


@app.command(context_settings={"ignore_unknown_options": True})
@cli_errors
def decode(
    ids: Annotated[list[str], typer.Argument(help="Token ids: `1 2 3`, `1,2,3` or `[1, 2, 3]`.")],
    keep_special: Annotated[
        bool, typer.Option("--keep-special", help="Keep special tokens in the text.")
    ] = False,
    json_out: JsonOpt = False,
    model: ModelOpt = None,
    tokenizer: TokenizerOpt = None,
) -> None:
    """Decode token IDS into text."""
    token_ids = parse_ids(ids)
    tok = _load(model, tokenizer)
    text = tok.decode(token_ids, skip_special_tokens=not keep_special)
    if json_out:
        typer.echo(
            json.dumps({"text": text, "tokens": tok.convert_ids_to_tokens(token_ids)}, ensure_ascii=False)
        )
    else:
        typer.echo(text)


@app.command()
@cli_errors
def count(
    text: TextArg,
    no_special: NoSpecialOpt = False,
    model: ModelOpt = None,
    tokenizer: TokenizerOpt = None,
) -> None:
    """Print the number of tokens in TEXT."""
    tok = _load(model, tokenizer)
    typer.echo(str(len(tok.encode(_read_text(text), add_special_tokens=not no_special))))


def tokenizer_info(tok: Any) -> dict[str, Any]:
    return {
        "name": tok.name,
        "vocab_size": tok.vocab_size,
        "bos_token": tok.bos_token,
        "bos_token_id": tok.bos_token_id,
        "eos_token": tok.eos_token,
        "eos_token_ids": sorted(tok.eos_token_ids),
        "model_max_length": tok.model_max_length,
        "has_chat_template": bool(tok.chat_template),
        "special_tokens": {str(i): t for i, t in sorted(tok.special_tokens.items())},
    }


@app.command()
@cli_errors
def info(json_out: JsonOpt = False, model: ModelOpt = None, tokenizer: TokenizerOpt = None) -> None:
    """Show vocabulary size, special tokens, BOS/EOS, max length and whether a chat template exists."""
    data = tokenizer_info(_load(model, tokenizer))
    if json_out:
        typer.echo(json.dumps(data, ensure_ascii=False, indent=2))
        return
    from rich.table import Table

    table = Table(title=f"Tokenizer: {data['name']}", show_header=False)
    table.add_column("field", style="bold")
    table.add_column("value", overflow="fold")
    for key, value in data.items():
        if key == "special_tokens":
            value = ", ".join(f"{t} ({i})" for i, t in value.items()) or "-"
        table.add_row(key, str(value) if value is not None else "-")
    console.print(table, markup=False, highlight=False)


@app.command("vocab-export")
@cli_errors
def vocab_export(
    file: Annotated[str, typer.Argument(help="Output JSON file (token -> id); '-' writes to stdout.")],
    model: ModelOpt = None,
    tokenizer: TokenizerOpt = None,
) -> None:
    """Write the vocabulary as JSON {token: id}, ordered by id."""
    tok = _load(model, tokenizer)
    vocab = dict(sorted(tok.get_vocab().items(), key=lambda kv: kv[1]))
    text = json.dumps(vocab, ensure_ascii=False, indent=0)
    if file == "-":
        typer.echo(text)
        return
    try:
        Path(file).write_text(text + "\n", encoding="utf-8")
    except OSError as exc:
        raise BadInput(f"cannot write {file!r}: {exc.strerror or exc}") from None
    console.print(f"wrote {len(vocab)} tokens to {file}", markup=False, highlight=False)


@app.command("save-pretrained")
@cli_errors
def save_pretrained(
    folder: Annotated[Path, typer.Argument(help="Output folder (created if missing).")],
    model: ModelOpt = None,
    tokenizer: TokenizerOpt = None,
) -> None:
    """Write the tokenizer as a Hugging Face tokenizer folder (e.g. a GGUF model's, for tools that read
    only those: `vllm bench serve --tokenizer FOLDER`, transformers' AutoTokenizer)."""
    files = _load(model, tokenizer).save_pretrained(folder)
    console.print(f"wrote {', '.join(f.name for f in files)} to {folder}", markup=False, highlight=False)


def _load_json(source: str, what: str) -> Any:
    try:
        raw = _read_stdin(what) if source == "-" else Path(source).read_text(encoding="utf-8")
    except OSError as exc:
        raise BadInput(f"cannot read {what} {source!r}: {exc.strerror or exc}") from None
    try:
        return json.loads(raw)
    except json.JSONDecodeError as exc:
        raise BadInput(f"{what} is not valid JSON: {exc}") from None


@app.command("chat-template")
@cli_errors
def chat_template(
    file: Annotated[
        str,
        typer.Argument(
            help="JSON messages (a list, or an object with 'messages' and optional 'tools'); '-': stdin."
        ),
    ] = "-",
    no_generation_prompt: Annotated[
        bool, typer.Option("--no-generation-prompt", help="Do not append the assistant turn header.")
    ] = False,
    kwargs: Annotated[
        Optional[str],
        typer.Option("--kwargs", help="Template variables as JSON, e.g. '{\"enable_thinking\": false}'."),
    ] = None,
    template_file: Annotated[
        Optional[Path], typer.Option("--template", help="Use this Jinja template instead of the model's.")
    ] = None,
    model: ModelOpt = None,
    tokenizer: TokenizerOpt = None,
) -> None:
    """Render messages with the model's chat template and print the prompt."""
    data = _load_json(file, "messages")
    tools = None
    if isinstance(data, dict):
        tools = data.get("tools")
        data = data.get("messages")
    template_kwargs: dict[str, Any] = {}
    if kwargs is not None:
        try:
            template_kwargs = json.loads(kwargs)
        except json.JSONDecodeError as exc:
            raise BadInput(f"--kwargs is not valid JSON: {exc}") from None
        if not isinstance(template_kwargs, dict):
            raise BadInput("--kwargs must be a JSON object, e.g. '{\"enable_thinking\": false}'")
    template = None
    if template_file is not None:
        try:
            template = template_file.read_text(encoding="utf-8")
        except OSError as exc:
            raise BadInput(f"cannot read --template {str(template_file)!r}: {exc.strerror or exc}") from None
    tok = _load(model, tokenizer)
    prompt = tok.apply_chat_template(
        data,
        add_generation_prompt=not no_generation_prompt,
        chat_template=template,
        tools=tools,
        **template_kwargs,
    )
    sys.stdout.write(prompt)
    if not prompt.endswith("\n"):
        sys.stdout.write("\n")
