"""`fd chat`: talk to any OpenAI-compatible server; streams answers and keeps the conversation.

Slash commands: /exit, /reset (forget the conversation), /save FILE (write it as JSON).
Reasoning (`reasoning_content`) is shown dimmed before the answer when the server splits it out.
"""

from __future__ import annotations

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
    MaxTokensOpt,
    ModelNameOpt,
    TemperatureOpt,
    UrlOpt,
    sampling_body,
)
from fdcli.console import err_console, error_boundary

HELP = "commands: /exit  /reset  /save FILE"


def _stream_reply(client: ApiClient, body: dict) -> str:
    """Stream one answer to stdout; returns the answer text (reasoning excluded)."""
    answer, in_reasoning = [], False
    for event in client.stream("/chat/completions", body):
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
    if in_reasoning and sys.stdout.isatty():
        sys.stdout.write("\x1b[0m")
    sys.stdout.write("\n")
    return "".join(answer)


def _slash(command: str, messages: list[dict], system: list[dict]) -> bool:
    """Handle a slash command; returns False when the session should end."""
    name, _, arg = command.partition(" ")
    if name in ("/exit", "/quit"):
        return False
    if name == "/reset":
        messages[:] = list(system)
        err_console.print("conversation reset")
    elif name == "/save":
        if not arg.strip():
            err_console.print("usage: /save FILE")
        else:
            Path(arg.strip()).expanduser().write_text(json.dumps(messages, indent=2, ensure_ascii=False))
            err_console.print(f"saved {len(messages)} messages to {arg.strip()}")
    else:
        err_console.print(f"unknown command {name}; {HELP}")
    return True


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
) -> None:
    """Chat interactively with an OpenAI-compatible server (default: the local `fd serve`)."""
    with error_boundary():
        client = ApiClient(url, api_key or os.environ.get("OPENAI_API_KEY"))
        model = model_name or client.first_model()
        system = [{"role": "system", "content": system_prompt}] if system_prompt else []
        messages = list(system)
        extra = sampling_body(max_tokens, temperature)
        if quick is not None:
            messages.append({"role": "user", "content": quick})
            _stream_reply(client, {"model": model, "messages": messages, **extra})
            return
        err_console.print(f"chatting with {model} at {url}; {HELP}")
        while True:
            try:
                line = input("> ")
            except EOFError:
                break
            if not line.strip():
                continue
            if line.startswith("/"):
                if not _slash(line.strip(), messages, system):
                    break
                continue
            messages.append({"role": "user", "content": line})
            answer = _stream_reply(client, {"model": model, "messages": messages, **extra})
            messages.append({"role": "assistant", "content": answer})
