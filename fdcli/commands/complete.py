"""`fd complete`: completions from any OpenAI-compatible server, streamed to stdout, as `vllm complete`.

`fd complete PROMPT` or `-q/--quick PROMPT` sends that one prompt and exits. Without a prompt (or
with `-`) each line read is one prompt, one completion each, until end of input: at a terminal after
a `> ` prompt, as vLLM's loop; from a pipe, one completion per input line. Blank lines are skipped.

Also home of the small HTTP/SSE helpers `fd chat` shares (httpx only; no engine imports), and of the
line loop both commands read their input with (`read_lines`).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from fdcli.console import BadInput, err_console, error_boundary, fail

DEFAULT_URL = "http://127.0.0.1:8000/v1"

UrlOpt = Annotated[
    str,
    typer.Option(
        "--url", help="Base URL of the OpenAI-compatible API (no scheme: http://, as curl; no path: /v1)."
    ),
]
ModelNameOpt = Annotated[
    Optional[str], typer.Option("--model-name", help="Model to use. Default: the server's first model.")
]
ApiKeyOpt = Annotated[
    Optional[str],
    typer.Option("--api-key", envvar="OPENAI_API_KEY", help="Bearer key. Default: $OPENAI_API_KEY."),
]
MaxTokensOpt = Annotated[Optional[int], typer.Option("--max-tokens", help="Most tokens to generate.", min=1)]
TemperatureOpt = Annotated[
    Optional[float], typer.Option("--temperature", help="Sampling temperature (0: greedy).", min=0.0, max=2.0)
]

JsonSchemaOpt = Annotated[
    Optional[Path],
    typer.Option(
        "--json-schema",
        help="JSON schema file: the answer is constrained to it (response_format json_schema).",
        dir_okay=False,
    ),
]


def json_schema_body(path: Path | None) -> dict[str, Any]:
    """The request fields for `--json-schema FILE` (OpenAI's response_format json_schema, named after
    the file); BadInput naming the file when it cannot be read or is not a JSON object."""
    if path is None:
        return {}
    try:
        schema = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise BadInput(f"--json-schema {str(path)!r}: cannot read it: {exc.strerror or exc}") from None
    except (ValueError, RecursionError) as exc:
        raise BadInput(f"--json-schema {str(path)!r} is not valid JSON: {exc}") from None
    if not isinstance(schema, dict):
        raise BadInput(f"--json-schema {str(path)!r} must hold a JSON schema object")
    name = "".join(c if c.isalnum() or c in "_-" else "_" for c in Path(path).stem)[:64] or "schema"
    return {
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": name, "schema": schema, "strict": True},
        }
    }


class ApiClient:
    """A thin OpenAI-API client: JSON calls and SSE streams, server errors as one-line BadInput/FdError."""

    def __init__(self, url: str, api_key: str | None, timeout: float = 600.0):
        import httpx

        from fdcli.server_url import api_base_url

        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.base = api_base_url(url, "--url")
        self.http = httpx.Client(headers=headers, timeout=httpx.Timeout(timeout, connect=5.0))

    def _raise_for(self, resp) -> None:
        if resp.status_code < 400:
            return
        try:
            resp.read()
            message = resp.json()["error"]["message"]
        except Exception:
            message = resp.text[:300]
        from fdcli_engine.errors import FdError

        raise FdError(f"server answered {resp.status_code}: {message}")

    def first_model(self) -> str:
        resp = self.http.get(f"{self.base}/models")
        self._raise_for(resp)
        data = resp.json().get("data") or []
        if not data:
            raise BadInput("the server lists no models")
        return data[0]["id"]

    def post(self, path: str, body: dict[str, Any]) -> dict:
        resp = self.http.post(f"{self.base}{path}", json=body)
        self._raise_for(resp)
        return resp.json()

    def stream(self, path: str, body: dict[str, Any]) -> Iterator[dict]:
        """Each SSE `data:` payload as a dict, until [DONE]; an error event raises."""
        with self.http.stream("POST", f"{self.base}{path}", json={**body, "stream": True}) as resp:
            self._raise_for(resp)
            for line in resp.iter_lines():
                if not line.startswith("data:"):
                    continue
                payload = line[5:].strip()
                if payload == "[DONE]":
                    return
                event = json.loads(payload)
                if "error" in event:
                    from fdcli_engine.errors import FdError

                    raise FdError(f"server error: {event['error'].get('message')}")
                yield event


def sampling_body(max_tokens: int | None, temperature: float | None) -> dict[str, Any]:
    body: dict[str, Any] = {}
    if max_tokens is not None:
        body["max_tokens"] = max_tokens
    if temperature is not None:
        body["temperature"] = temperature
    return body


def read_lines(read_line=input, prompt: str = "> ") -> Iterator[str]:
    """Each non-blank line `read_line(prompt)` returns, until it raises EOFError (Ctrl-D, end of a
    pipe) or KeyboardInterrupt (Ctrl-C at the prompt); then a newline ends the prompt's line."""
    while True:
        try:
            line = read_line(prompt)
        except (EOFError, KeyboardInterrupt):
            if prompt:
                sys.stdout.write("\n")
            return
        if line.strip():
            yield line


def _stream_completion(client: ApiClient, body: dict[str, Any]) -> None:
    for event in client.stream("/completions", body):
        for choice in event.get("choices", []):
            sys.stdout.write(choice.get("text", ""))
            sys.stdout.flush()
    sys.stdout.write("\n")


def complete(
    prompt: Annotated[
        Optional[str],
        typer.Argument(help="One prompt; '-' or nothing: one prompt per line of stdin (or at '> ')."),
    ] = None,
    quick: Annotated[
        Optional[str],
        typer.Option("--quick", "-q", metavar="PROMPT", help="Send one prompt, print the completion, exit."),
    ] = None,
    url: UrlOpt = DEFAULT_URL,
    model_name: ModelNameOpt = None,
    api_key: ApiKeyOpt = None,
    max_tokens: MaxTokensOpt = 128,
    temperature: TemperatureOpt = None,
    json_output: Annotated[bool, typer.Option("--json", help="Print the whole JSON response.")] = False,
    json_schema: JsonSchemaOpt = None,
) -> None:
    """Complete prompts with an OpenAI-compatible server and stream the text: one prompt (an argument
    or -q), or one per line of input."""
    if quick is not None and prompt is not None:
        fail("give the prompt once: as an argument or with -q/--quick", 2)
    one = quick if quick is not None else prompt if prompt != "-" else None
    if one is not None and not one:
        fail("the prompt is empty", 2)
    with error_boundary():
        constrained = json_schema_body(json_schema)  # a bad file fails before any request
        client = ApiClient(url, api_key or os.environ.get("OPENAI_API_KEY"))
        base = {"model": model_name or client.first_model(), **sampling_body(max_tokens, temperature)}
        base.update(constrained)
        interactive = one is None and sys.stdin.isatty()
        if interactive:
            err_console.print(
                f"completing with {base['model']} at {client.base}: one prompt per line, Ctrl-D to end",
                markup=False,
            )
        prompts = [one] if one is not None else read_lines(prompt="> " if interactive else "")
        for text in prompts:
            body = {**base, "prompt": text}
            if json_output:
                sys.stdout.write(json.dumps(client.post("/completions", body), indent=2) + "\n")
            else:
                _stream_completion(client, body)
