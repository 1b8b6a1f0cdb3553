"""Start a real `fd serve` process on a free loopback port (used by tests/server and tests/cli).

The default server serves a tiny random Llama (tests/tiny_models.py) with an API key, so every test also
exercises auth through the official `openai` SDK. One such server is session-wide (tests/conftest.py);
tests that kill, drain or reconfigure a server start their own with `start_server`.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

API_KEY = "test-key-123"
REPO = Path(__file__).resolve().parents[2]


def read_until_closed(s: socket.socket) -> bytes:
    """Everything a raw socket receives until the server closes it (bounded by the socket's timeout)."""
    out = b""
    try:
        while chunk := s.recv(65536):
            out += chunk
    except ConnectionResetError:
        pass
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Server:
    proc: subprocess.Popen
    port: int
    log: Path
    api_key: str | None
    ca_file: str | None = None  # HTTPS (--ssl-certfile): the certificate clients verify the server with

    @property
    def url(self) -> str:
        return f"{'https' if self.ca_file else 'http'}://127.0.0.1:{self.port}"

    @property
    def headers(self) -> dict:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def client(self):
        import openai

        return openai.OpenAI(base_url=f"{self.url}/v1", api_key=self.api_key or "none", max_retries=0)

    def async_client(self):
        import openai

        return openai.AsyncOpenAI(base_url=f"{self.url}/v1", api_key=self.api_key or "none", max_retries=0)

    def http(self, **kw) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers=self.headers, timeout=60, verify=self.verify(), **kw)

    def verify(self):
        """httpx's `verify` for this server: its own certificate under HTTPS."""
        import ssl

        return ssl.create_default_context(cafile=self.ca_file) if self.ca_file else True

    def metrics(self) -> dict[str, float]:
        text = httpx.get(f"{self.url}/metrics", headers=self.headers, timeout=10).text
        out = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                name, _, value = line.rpartition(" ")
                out[name] = float(value)
        return out

    def core_process(self):
        """The engine-core process (psutil.Process): the server's one child running core_proc."""
        import psutil

        core = [c for c in psutil.Process(self.proc.pid).children() if "core_proc" in " ".join(c.cmdline())]
        assert len(core) == 1, core
        return core[0]

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


def start_server(
    model: Path | None, tmp: Path, *extra: str, api_key: str | None = API_KEY, wait_ready=True
) -> Server:
    port = free_port()
    log = tmp / f"server-{port}.log"
    cmd = [sys.executable, "-m", "fdcli.main", "serve", "--port", str(port)]
    if model is not None:  # None: the default model (SmolLM2)
        cmd += ["--model", str(model)]
    defaults = {"--num-kv-blocks": "128", "--max-num-seqs": "32", "--threads": "1"}
    for flag, value in defaults.items():
        if flag not in extra:  # a flag given in `extra` replaces the default
            cmd += [flag, value]
    cmd += list(extra)
    if api_key:
        cmd += ["--api-key", api_key]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("FD_API_KEY", None)
    proc = subprocess.Popen(cmd, stdout=log.open("w"), stderr=subprocess.STDOUT, cwd=REPO, env=env)
    cert = extra[extra.index("--ssl-certfile") + 1] if "--ssl-certfile" in extra else None
    server = Server(proc, port, log, api_key, cert)
    if wait_ready:
        wait_until_ready(server)
    return server


def wait_for(predicate, timeout: float, what: str):
    """predicate()'s first truthy value within timeout seconds, else an AssertionError naming `what`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def stream_in_background(server: Server, sink: list, max_tokens: int = 240) -> threading.Thread:
    """A long streamed completion of model "tiny" on a daemon thread: each SSE line, or the client's
    error, goes to `sink`, so a test can kill a part of the server mid-stream and see how it ends."""

    def stream():
        body = {
            "model": "tiny",
            "prompt": "hello",
            "max_tokens": max_tokens,
            "ignore_eos": True,
            "stream": True,
        }
        try:
            with httpx.Client(headers=server.headers, timeout=60) as h:
                with h.stream("POST", f"{server.url}/v1/completions", json=body) as r:
                    sink.extend(r.iter_lines())
        except httpx.HTTPError as e:
            sink.append(str(e))

    t = threading.Thread(target=stream, daemon=True)
    t.start()
    return t


def wait_until_ready(server: Server, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.proc.poll() is not None:
            raise RuntimeError(f"fd serve exited {server.proc.returncode}:\n{server.log.read_text()[-3000:]}")
        try:
            ready = httpx.get(
                f"{server.url}/ready", headers=server.headers, timeout=2, verify=server.verify()
            )
            if ready.status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    server.stop()
    raise RuntimeError(f"fd serve not ready after {timeout}s:\n{server.log.read_text()[-3000:]}")


def make_tiny_model(folder: Path, seed: int = 3, **overrides) -> Path:
    from tiny_models import make_tiny_checkpoint, write_tiny_tokenizer

    make_tiny_checkpoint("LlamaForCausalLM", folder, seed=seed, **overrides)
    write_tiny_tokenizer(folder)
    return folder
