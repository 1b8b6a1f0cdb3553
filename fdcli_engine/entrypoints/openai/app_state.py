"""Server-wide state shared by the HTTP app: options, admission control, draining, API keys."""

from __future__ import annotations

import asyncio
import hmac
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from fdcli_engine.entrypoints.openai.errors import APIError
from fdcli_engine.entrypoints.openai.serving_options import ServingOptions


@dataclass
class ServerArgs:
    host: str = "127.0.0.1"
    port: int = 8000
    api_keys: list[str] = field(default_factory=list, repr=False)  # never logged
    max_concurrency: int = 256  # requests admitted at once; more wait up to max_waiting_time
    max_waiting_time: float = -1.0  # seconds to wait for admission (<0: no limit, 0: reject at once)
    max_queue_size: int = 1024  # requests waiting for admission; one more gets 429 at once
    timeout_graceful_shutdown: float = 30.0
    max_request_body_bytes: int = 32 << 20
    uvicorn_log_level: str = "warning"
    metrics_port: int | None = None  # FastDeploy's: /metrics alone on this port too, without the API key
    # HTTP framing (http_guard.py): head size and header count (431), head/body read timeouts (408),
    # open connections, keep-alive idle time. Names as vLLM's and uvicorn's.
    h11_max_incomplete_event_size: int = 4 << 20
    h11_max_header_count: int = 256
    timeout_request_header: float = 30.0
    timeout_request_body: float = 120.0
    max_connections: int = 2048
    timeout_keep_alive: float = 5.0
    # vLLM's server flags: the ASGI root_path behind a path-prefix proxy; an X-Request-Id header on every
    # response (request_id_header.py); the uvicorn access log fd never writes (the flag says so).
    root_path: str = ""
    enable_request_id_headers: bool = False
    disable_uvicorn_access_log: bool = False
    # vLLM's HTTPS flags, handed to uvicorn (ssl_cert_reqs: the ssl module's CERT_NONE 0, CERT_OPTIONAL
    # 1, CERT_REQUIRED 2 for client certificates checked against ssl_ca_certs).
    ssl_keyfile: str | None = None
    ssl_certfile: str | None = None
    ssl_ca_certs: str | None = None
    ssl_cert_reqs: int = 0
    ssl_ciphers: str = "TLSv1"  # uvicorn's default
    disable_fastapi_docs: bool = False  # vLLM's: no /openapi.json, /docs or /redoc
    # vLLM's GET /load: {"server_load": requests being served}; 0 unless this is on.
    enable_server_load_tracking: bool = False
    log_config_file: str | None = None  # vLLM's: logging.config.dictConfig of this JSON, uvicorn's too
    serving: ServingOptions = field(default_factory=ServingOptions)  # chat template, parsers, names
    # CORS (vLLM's options): None sends no CORS headers at all; the others apply once origins are given.
    allowed_origins: list[str] | None = None
    allowed_methods: list[str] = field(default_factory=lambda: ["*"])
    allowed_headers: list[str] = field(default_factory=lambda: ["*"])
    allow_credentials: bool = False


class Admission:
    """At most `limit` requests in flight; the next ones wait up to `max_wait` seconds, then get 429.

    `inflight` counts admitted requests until their response (stream included) is finished; draining
    waits on it. `close()` (the server starts draining) answers every waiting request with 503 at
    once, as the drain answers new ones: a request that was never admitted is not left to time out
    into a 429.
    """

    def __init__(self, limit: int, max_wait: float, max_queue: int = 1 << 30):
        self.limit = max(1, limit)
        self.max_wait = max_wait
        self.max_queue = max(0, max_queue)
        self.waiting = 0
        self._sem = asyncio.Semaphore(self.limit)
        self.inflight = 0
        self.idle = asyncio.Event()
        self.idle.set()
        self.closed = asyncio.Event()

    def close(self) -> None:
        self.closed.set()

    async def acquire(self) -> float:
        """Wait for a slot; returns the seconds waited."""
        loop = asyncio.get_running_loop()
        start = loop.time()
        if self.closed.is_set():
            raise shutting_down()
        if self._sem.locked() and self.waiting >= self.max_queue:
            raise _too_many(self.limit, self.waiting)
        self.waiting += 1
        try:
            if not self._sem.locked():
                await self._sem.acquire()  # a free slot is taken at once, whatever max_wait says
            elif self.max_wait == 0:
                raise _too_many(self.limit)
            else:
                await self._wait_for_slot()
        finally:
            self.waiting -= 1
        self.inflight += 1
        self.idle.clear()
        return loop.time() - start

    async def _wait_for_slot(self) -> None:
        """Until a slot frees (taken), the wait runs out (429) or the server closes (503)."""
        slot = asyncio.ensure_future(self._sem.acquire())
        closing = asyncio.ensure_future(self.closed.wait())
        try:
            timeout = None if self.max_wait < 0 else self.max_wait
            await asyncio.wait({slot, closing}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            closing.cancel()
            if not slot.done():
                slot.cancel()
        if slot.done() and not slot.cancelled():
            if not self.closed.is_set():
                return
            self._sem.release()  # taken as the server closed: give it back, the request is refused
        raise shutting_down() if self.closed.is_set() else _too_many(self.limit)

    def release(self) -> None:
        self.inflight -= 1
        self._sem.release()
        if self.inflight == 0:
            self.idle.set()

    @asynccontextmanager
    async def slot(self):
        await self.acquire()
        try:
            yield
        finally:
            self.release()


@dataclass
class AppState:
    """What the HTTP app reads on every request: the options, admission, and whether it is draining."""

    args: ServerArgs
    admission: Admission
    draining: bool = False


def shutting_down() -> APIError:
    return APIError("the server is shutting down", 503)


def _too_many(limit: int, queued: int | None = None) -> APIError:
    queue = f" and {queued} queued" if queued is not None else ""
    return APIError(
        f"the server is at its limit of {limit} concurrent requests{queue}; retry shortly",
        429,
        code="too_many_requests",
        headers={"Retry-After": "1"},
    )


def key_matches(given: str, keys: list[str]) -> bool:
    """Constant-time comparison against every key (no early exit on the first match)."""
    ok = False
    for key in keys:
        ok |= hmac.compare_digest(given.encode(), key.encode())
    return ok
