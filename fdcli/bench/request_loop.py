"""The `fd bench serve` loop: readiness wait, warmups, scheduled arrivals under a concurrency cap.

`RunState` is filled as requests finish, so a Ctrl-C (which cancels the loop) still leaves every
completed record and the start time behind for a partial summary.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from fdcli.bench import http1
from fdcli.bench.client import BackendConfig, send_request
from fdcli.bench.datasets import SampleRequest
from fdcli.bench.metrics import RequestRecord
from fdcli_engine.errors import FdError

READY_POLL_S = 0.5


class ServerNotReady(FdError):
    """The server could not be reached, or never became ready, within --ready-timeout."""


@dataclass
class RunState:
    records: list[RequestRecord] = field(default_factory=list)
    bench_start: float | None = None
    bench_end: float | None = None
    warmup_errors: list[str] = field(default_factory=list)


@dataclass
class TrafficConfig:
    offsets: list[float]
    max_concurrency: int | None = None
    num_warmups: int = 0


def _models_from(resp) -> list[str]:
    try:
        data = resp.json().get("data") or []
        return [m["id"] for m in data if isinstance(m, dict) and isinstance(m.get("id"), str)]
    except (ValueError, AttributeError, TypeError):
        return []


def _still_loading(client, base: str) -> str | None:
    """Some servers list models before they can serve (llama.cpp, fd while loading weights): they answer
    /health or /ready with a 5xx until then. A 404 means the probe does not exist, which is fine."""
    for path in ("/health", "/ready"):
        status = client.get(base + path).status_code
        if status >= 500:
            return f"{base}{path} answered {status} (still loading?)"
    return None


def wait_ready(
    base_url: str, headers: dict, timeout: float, sleep=time.sleep, verify: bool = True
) -> list[str]:
    """Poll until /v1/models answers 200 and /health, /ready (where they exist) are not 5xx; return the
    model ids listed (a server without /v1/models but with a healthy /health gives []).

    401/403 stop at once (waiting will not fix a key); anything else retries until `timeout`.
    """
    import httpx

    base = base_url.rstrip("/")
    deadline = time.monotonic() + max(timeout, 0.0)
    last = "no answer"
    with httpx.Client(headers=headers, timeout=5.0, verify=verify) as client:
        while True:
            try:
                resp = client.get(base + "/v1/models")
                if resp.status_code == 200:
                    busy = _still_loading(client, base)
                    if busy is None:
                        return _models_from(resp)
                    last = busy
                elif resp.status_code in (401, 403):
                    raise ServerNotReady(
                        f"{base}/v1/models answered {resp.status_code}: check --api-key / OPENAI_API_KEY"
                    )
                elif resp.status_code == 404 and client.get(base + "/health").status_code == 200:
                    return []
                else:
                    last = f"HTTP {resp.status_code} from {base}/v1/models"
            except httpx.HTTPError as exc:
                last = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            if time.monotonic() >= deadline:
                raise ServerNotReady(
                    f"server at {base} not ready after {timeout:g} s (--ready-timeout): {last}"
                )
            sleep(READY_POLL_S)


class BenchClient:
    """What send_request calls: `stream()` and `post()`. Streams to a plain-http server go through
    http1.Pool (a fraction of httpx's CPU per streamed token, see there); https, proxied URLs and the
    non-streamed embeddings requests through httpx."""

    def __init__(self, cfg: BackendConfig, max_concurrency: int | None) -> None:
        import httpx

        # httpx caps a pool at 100 connections by default, which would silently cap concurrency.
        limits = httpx.Limits(max_connections=max_concurrency, max_keepalive_connections=max_concurrency)
        self.httpx = httpx.AsyncClient(
            timeout=httpx.Timeout(cfg.request_timeout), limits=limits, verify=cfg.verify
        )
        self.pool = http1.Pool() if http1.use_for(cfg.url) else None

    def stream(self, method: str, url: str, **kwargs):
        return (self.pool or self.httpx).stream(method, url, **kwargs)

    def post(self, url: str, **kwargs):
        return self.httpx.post(url, **kwargs)

    async def __aenter__(self) -> BenchClient:
        return self

    async def __aexit__(self, *exc) -> None:
        if self.pool is not None:
            await self.pool.aclose()
        await self.httpx.aclose()


async def _warmup(client, cfg, requests, traffic, tokenizer, state: RunState) -> None:
    if traffic.num_warmups <= 0:
        return
    sem = asyncio.Semaphore(traffic.max_concurrency or traffic.num_warmups)

    async def one(i: int) -> RequestRecord:
        async with sem:
            return await send_request(client, cfg, requests[i % len(requests)], -1 - i, tokenizer)

    results = await asyncio.gather(*(one(i) for i in range(traffic.num_warmups)))
    state.warmup_errors = [r.error for r in results if not r.ok]


async def run_benchmark(
    cfg: BackendConfig,
    requests: list[SampleRequest],
    traffic: TrafficConfig,
    state: RunState,
    tokenizer=None,
    on_done: Callable[[RequestRecord], None] | None = None,
    clock=time.perf_counter,
) -> RunState:
    sem = asyncio.Semaphore(traffic.max_concurrency) if traffic.max_concurrency else None
    async with BenchClient(cfg, traffic.max_concurrency) as client:
        await _warmup(client, cfg, requests, traffic, tokenizer, state)
        if traffic.num_warmups and len(state.warmup_errors) == traffic.num_warmups:
            raise ServerNotReady(f"every warmup request failed; first error: {state.warmup_errors[0]}")
        state.bench_start = clock()

        async def one(i: int, req: SampleRequest) -> None:
            delay = state.bench_start + traffic.offsets[i] - clock()
            if delay > 0 and math.isfinite(delay):
                await asyncio.sleep(delay)
            if sem is None:
                record = await send_request(client, cfg, req, i, tokenizer, clock)
            else:
                async with sem:
                    record = await send_request(client, cfg, req, i, tokenizer, clock)
            state.records.append(record)
            if on_done is not None:
                on_done(record)

        await asyncio.gather(*(one(i, r) for i, r in enumerate(requests)))
        state.bench_end = clock()
    return state
