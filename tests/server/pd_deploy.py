"""A prefill/decode deployment of real processes on 127.0.0.1 for the tests: `fd router` and
`fd serve --splitwise-role prefill|decode --router ...` instances of the tiny model, one thread each."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from fd_server import API_KEY, REPO, Server, free_port, start_server, wait_for


@dataclass
class Router:
    proc: subprocess.Popen
    port: int
    log: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def client(self, **kw):
        import openai

        return openai.OpenAI(base_url=f"{self.url}/v1", api_key=API_KEY, max_retries=0, **kw)

    def instances(self) -> list[dict]:
        return httpx.get(f"{self.url}/instances", timeout=5).json()["instances"]

    def stop(self) -> None:
        stop_process(self.proc)


def start_router(tmp: Path, *extra: str) -> Router:
    port = free_port()
    log = tmp / f"router-{port}.log"
    cmd = [sys.executable, "-m", "fdcli.main", "router", "--port", str(port), *extra]
    proc = subprocess.Popen(cmd, stdout=log.open("w"), stderr=subprocess.STDOUT, cwd=REPO)
    router = Router(proc, port, log)

    def up():
        assert proc.poll() is None, log.read_text()
        try:
            return httpx.get(f"{router.url}/instances", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    wait_for(up, 60, "fd router")
    return router


def stop_process(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


@dataclass
class Deployment:
    model: Path
    tmp: Path
    router: Router
    instances: dict[str, Server] = field(default_factory=dict)

    def add(self, name: str, role: str, *extra: str) -> Server:
        """Start instance `name` (if not running) and wait until the router lists it."""
        srv = self.instances.get(name)
        if srv is not None and srv.proc.poll() is None:
            return srv
        srv = start_server(
            self.model, self.tmp, "--served-model-name", "tiny", "--splitwise-role", role,
            "--router", f"127.0.0.1:{self.router.port}", *extra,
        )  # fmt: skip
        self.instances[name] = srv
        wait_for(lambda: srv.url in self.urls(), 20, f"{name} registered with the router")
        return srv

    def urls(self) -> set[str]:
        return {i["url"] for i in self.router.instances()}

    def kill(self, name: str) -> None:
        """SIGKILL the instance's server and its engine core (no goodbye to the router)."""
        srv = self.instances.pop(name)
        import psutil

        children = psutil.Process(srv.proc.pid).children(recursive=True)
        os.kill(srv.proc.pid, signal.SIGKILL)
        srv.proc.wait(10)
        for c in children:
            try:
                c.kill()
            except psutil.NoSuchProcess:
                pass

    def stop(self) -> None:
        for srv in self.instances.values():
            srv.stop()
        self.router.stop()


@contextlib.contextmanager
def one_prefill_one_decode(model: Path, tmp: Path, *router_args: str):
    """A router (with `router_args`), prefill instance p1 and decode instance d1; all stopped after."""
    dep = Deployment(model, tmp, start_router(tmp, *router_args))
    try:
        dep.add("p1", "prefill")
        dep.add("d1", "decode")
        yield dep
    finally:
        dep.stop()
