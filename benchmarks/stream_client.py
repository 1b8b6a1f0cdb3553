"""A light streaming-completion client for the serving benchmarks: one HTTP/1.1 request over `fd bench`'s
own transport (fdcli/bench/http1.py), the whole SSE body parsed once it has ended, every stream checked.

Why not httpx: the benchmark client runs on the same cores as the server it measures, and httpx spends
about 0.3 ms of CPU per streamed token (its response machinery and line iterator), as much as the server's
front end, which skews the comparison with the in-process engine against the server. This one reads the
socket in large pieces and decodes each event with msgspec.

Nothing is skipped: every event is parsed, its token ids counted, and a stream passes only if it ends with
a finish_reason, then `data: [DONE]`, carries no error event, and (when asked) has exactly the expected
number of tokens. Anything else raises StreamError.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import msgspec

from fdcli.bench import http1
from fdcli_engine.entrypoints.event_loop import event_loop_runner

_decoder = msgspec.json.Decoder()


class StreamError(Exception):
    """The server's stream was not a complete, well-formed, error-free completion stream."""


async def stream_completion(
    url: str, path: str, body: dict, expected_tokens: int | None = None, headers: dict | None = None
) -> int:
    """POST `body` (with "stream": true) to `url + path`; returns the number of output tokens streamed
    (the `token_ids` of every choice, so the request needs "return_token_ids": true)."""
    async with http1.Pool() as pool, pool.stream("POST", url + path, json=body, headers=headers) as resp:
        if resp.status_code != 200:
            raise StreamError(f"server answered {resp.status_code}: {(await resp.aread())[:300]!r}")
        if resp.headers.get("transfer-encoding", "").lower() != "chunked":
            raise StreamError(f"expected a chunked SSE body, got headers {resp.headers}")
        # The events are parsed once the stream has ended, so receiving stays as cheap as reading the
        # socket (the same bytes are parsed either way).
        return _check_events(await resp.aread(), expected_tokens)


def _check_events(body: bytes, expected_tokens: int | None) -> int:
    if not body.endswith(b"\n\n"):
        raise StreamError(f"the stream ends mid-event: {body[-200:]!r}")
    events = body[:-2].split(b"\n\n")
    if events[-1] != b"data: [DONE]":
        raise StreamError(f"the stream does not end with [DONE]: {events[-1][:300]!r}")
    tokens, finish = 0, None
    for event in events[:-1]:
        if not event.startswith(b"data: {"):
            raise StreamError(f"unexpected event {event[:300]!r}")
        chunk = _decoder.decode(event[6:])
        if "error" in chunk:
            raise StreamError(f"error event: {chunk['error']}")
        for choice in chunk["choices"]:
            tokens += len(choice.get("token_ids") or [])
            finish = choice.get("finish_reason") or finish
    if finish is None:
        raise StreamError("no chunk carried a finish_reason")
    if expected_tokens is not None and tokens != expected_tokens:
        raise StreamError(f"streamed {tokens} tokens, expected {expected_tokens}")
    return tokens


def run(coro):
    """asyncio.run on uvloop's event loop when it is installed (less CPU per wake-up: one per token at
    concurrency 1), else asyncio's."""
    with event_loop_runner() as runner:
        return runner.run(coro)


def free_port() -> int:
    """A loopback port nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(proc: subprocess.Popen, url: str, name: str, seconds: float, path: str = "/ready") -> None:
    """Polls `url` + `path` until it answers 200; exits (killing `proc`) if it dies or `seconds` pass."""
    import httpx

    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}{path}", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if proc.poll() is not None:
            raise SystemExit(f"{name} exited with {proc.returncode}")
        time.sleep(0.25)
    proc.kill()
    raise SystemExit(f"{name} did not become ready")


def start_fd_serve(serve_args: list[str], env: dict | None = None) -> tuple[subprocess.Popen, str]:
    """`fd serve *serve_args` on a free loopback port, ready (or SystemExit); returns it and its URL.

    The server gets every CPU this process was given: one started after an in-process engine has pinned
    this thread to one CPU would otherwise inherit that one CPU."""
    from fdcli_engine.threads import allowed_cpus

    port = free_port()
    cmd = [sys.executable, "-m", "fdcli.main", "serve", "--port", str(port), *serve_args]
    cpus = set(allowed_cpus())  # empty where the OS has no affinity: nothing to reset
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
        preexec_fn=(lambda: os.sched_setaffinity(0, cpus)) if cpus else None,
    )
    url = f"http://127.0.0.1:{port}"
    wait_ready(proc, url, "fd serve", 300)
    return proc, url


def stop_fd_serve(proc: subprocess.Popen) -> None:
    """SIGTERM (the server drains and exits), SIGKILL after 30 s."""
    proc.terminate()
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
