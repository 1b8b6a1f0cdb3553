"""`fd chat`: talk to any OpenAI-compatible server; streams answers and keeps the conversation.

Slash commands: /help, /exit, /reset (forget the conversation), /save FILE (write it as JSON).
`--image PATH` (repeatable) attaches pictures to the next user message as base64 data: URLs in
image_url parts (OpenAI's form; a vision model's server reads them, docs/images.md).
Reasoning (`reasoning_content`) is shown dimmed before the answer when the server splits it out.

Ctrl-C while an answer streams stops that answer only (the stream is closed, so the server aborts the
request): the partial text stays in the conversation as the assistant's turn, as chat apps keep a
stopped answer, so "go on" continues it; an answer stopped before any text drops its user turn too.
Ctrl-C or Ctrl-D at the prompt ends the session.
"""

from __future__ import annotations

import base64
import json
import os
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from fdcli.commands.complete import (
    DEFAULT_URL,
    ApiClient,
    ApiKeyOpt,
    JsonSchemaOpt,
    MaxTokensOpt,
    ModelNameOpt,
    TemperatureOpt,
    UrlOpt,
    json_schema_body,
    read_lines,
    sampling_body,
)
from fdcli.console import BadInput, err_console, error_boundary

HELP = "commands: /help  /exit  /reset  /save FILE"
COMMANDS = (
    ("/help", "list these commands"),
    ("/exit, /quit", "end the session (also Ctrl-D, or Ctrl-C at the prompt)"),
    ("/reset", "forget the conversation (the --system-prompt stays)"),
    ("/save FILE", "write the conversation as JSON"),
    ("Ctrl-C", "while an answer streams: stop that answer, keep the session"),
)


class AnswerInterrupted(KeyboardInterrupt):
    """Ctrl-C while an answer streamed; `partial` is the answer text received before it."""

    def __init__(self, partial: str) -> None:
        super().__init__()
        self.partial = partial


def _stream_reply(client: ApiClient, body: dict) -> str:
    """Stream one answer to stdout; returns the answer text (reasoning excluded). Ctrl-C closes the
    stream and raises AnswerInterrupted with the text so far."""
    answer, in_reasoning = [], False
    events = client.stream("/chat/completions", body)
    try:
        for event in events:
            for choice in event.get("choices", []):
                delta = choice.get("delta") or {}
                if delta.get("reasoning_content"):
                    if not in_reasoning:
                        sys.stdout.write("\x1b[2m" if sys.stdout.isatty() else "[reasoning] ")
                        in_reasoning = True
                    sys.stdout.write(delta["reasoning_content"])
                if delta.get("content"):
                    if in_reasoning:
                        sys.stdout.write("\x1b[0m\n" if sys.stdout.isatty() else "\n[answer] ")
                        in_reasoning = False
                    sys.stdout.write(delta["content"])
                    answer.append(delta["content"])
                sys.stdout.flush()
    except KeyboardInterrupt:
        raise AnswerInterrupted("".join(answer)) from None
    finally:
        close = getattr(events, "close", None)
        if close is not None:
            close()  # a generator stopped mid-stream: closes the HTTP response, the server aborts
        if in_reasoning and sys.stdout.isatty():
            sys.stdout.write("\x1b[0m")
        sys.stdout.write("\n")
        sys.stdout.flush()
    return "".join(answer)


def _slash(command: str, messages: list[dict], system: list[dict]) -> bool:
    """Handle a slash command; returns False when the session should end."""
    name, _, arg = command.partition(" ")
    if name in ("/exit", "/quit"):
        return False
    if name == "/help":
        for usage, what in COMMANDS:
            err_console.print(f"  {usage:<14} {what}", highlight=False, markup=False)
    elif name == "/reset":
        messages[:] = list(system)
        err_console.print("conversation reset")
    elif name == "/save":
        if not arg.strip():
            err_console.print("usage: /save FILE")
        else:
            Path(arg.strip()).expanduser().write_text(json.dumps(messages, indent=2, ensure_ascii=False))
            err_console.print(f"saved {len(messages)} messages to {arg.strip()}")
    else:
        err_console.print(f"unknown command {name}; {HELP}", markup=False)
    return True


def _turn(client: ApiClient, body: dict, messages: list[dict]) -> None:
    """One user turn (already in `messages`): stream the answer and add it; Ctrl-C keeps the partial
    answer, or drops the unanswered user turn when there is none."""
    try:
        answer = _stream_reply(client, body)
    except AnswerInterrupted as stop:
        err_console.print("(answer interrupted)")
        if not stop.partial:
            messages.pop()
            return
        answer = stop.partial
    messages.append({"role": "assistant", "content": answer})


_MIME = {"PNG": "image/png", "JPEG": "image/jpeg", "WEBP": "image/webp"}


def image_parts(paths: list[Path] | None) -> list[dict]:
    """An image_url part (base64 data: URL) per file; BadInput for a file that cannot be read, is too
    large for a server to accept, or is not a PNG, JPEG or WebP picture (told by its bytes)."""
    if not paths:
        return []
    from fdcli_engine.multimodal.image_check import sniff_format  # leaf module: no engine, no paddle
    from fdcli_engine.multimodal.media import MAX_IMAGE_BYTES

    parts = []
    for path in paths:
        try:
            with Path(path).expanduser().open("rb") as f:
                data = f.read(MAX_IMAGE_BYTES + 1)
        except OSError as exc:
            raise BadInput(f"cannot read --image {str(path)!r}: {exc.strerror or exc}") from None
        if len(data) > MAX_IMAGE_BYTES:
            raise BadInput(f"--image {str(path)!r} is larger than {MAX_IMAGE_BYTES} bytes")
        fmt = sniff_format(data)
        if fmt is None:
            raise BadInput(f"--image {str(path)!r} is not a PNG, JPEG or WebP picture")
        url = f"data:{_MIME[fmt]};base64," + base64.b64encode(data).decode("ascii")
        parts.append({"type": "image_url", "image_url": {"url": url}})
    return parts


def user_message(text: str, images: list[dict]) -> dict:
    """The user turn: the text alone, or the pictures then the text as content parts."""
    if not images:
        return {"role": "user", "content": text}
    return {"role": "user", "content": [*images, {"type": "text", "text": text}]}


def run_session(
    client: ApiClient, model: str, messages: list[dict], extra: dict, read_line=input, images=()
) -> None:
    """The interactive loop; `read_line(prompt)` raises EOFError (Ctrl-D) or KeyboardInterrupt (Ctrl-C)
    to end the session. `messages` starts with the system turn, if any, and is updated in place.
    `images` (image_url parts) go with the first user message."""
    pending = list(images)
    system = [m for m in messages if m.get("role") == "system"]
    for line in read_lines(read_line):
        if line.startswith("/"):
            if not _slash(line.strip(), messages, system):
                return
            continue
        messages.append(user_message(line, pending))
        pending = []
        _turn(client, {"model": model, "messages": list(messages), **extra}, messages)


def chat(
    url: UrlOpt = DEFAULT_URL,
    model_name: ModelNameOpt = None,
    api_key: ApiKeyOpt = None,
    system_prompt: Annotated[Optional[str], typer.Option("--system-prompt", help="System message.")] = None,
    quick: Annotated[
        Optional[str], typer.Option("--quick", "-q", help="Send one message, print the answer, exit.")
    ] = None,
    max_tokens: MaxTokensOpt = None,
    temperature: TemperatureOpt = None,
    json_schema: JsonSchemaOpt = None,
    image: Annotated[
        Optional[list[Path]],
        typer.Option(
            "--image", help="Attach a PNG, JPEG or WebP file to the next user message (repeatable)."
        ),
    ] = None,
) -> None:
    """Chat interactively with an OpenAI-compatible server (default: the local `fd serve`)."""
    with error_boundary():
        constrained = json_schema_body(json_schema)  # a bad file fails before any request
        images = image_parts(image)  # so does a missing or unsupported picture
        client = ApiClient(url, api_key or os.environ.get("OPENAI_API_KEY"))
        model = model_name or client.first_model()
        system = [{"role": "system", "content": system_prompt}] if system_prompt else []
        messages = list(system)
        extra = {**sampling_body(max_tokens, temperature), **constrained}
        if quick is not None:
            messages.append(user_message(quick, images))
            _stream_reply(client, {"model": model, "messages": messages, **extra})
            return
        err_console.print(f"chatting with {model} at {client.base}; {HELP}", markup=False)
        run_session(client, model, messages, extra, images=images)
