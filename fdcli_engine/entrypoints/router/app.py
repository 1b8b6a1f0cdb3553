"""The router's HTTP app (FastAPI): registration, the OpenAI generation routes through a prefill and
a decode instance, and /health, /metrics, /v1/models over every instance."""

from __future__ import annotations

import asyncio
import contextlib
import json

import httpx
from fastapi import FastAPI, Request
from starlette.responses import JSONResponse, PlainTextResponse, Response

from fdcli_engine.entrypoints.router.metrics import merge_metrics
from fdcli_engine.entrypoints.router.proxy import PDProxy, error_response, forwarded
from fdcli_engine.entrypoints.router.registry import ROLES, Registry
from fdcli_engine.kv_transfer.pd.settings import REGISTER_TOKEN_HEADER, token_accepted

GENERATION_ROUTES = ("/v1/completions", "/v1/chat/completions")
CONNECT_TIMEOUT_S = 3.0
PROBE_TIMEOUT_S = 5.0
MAX_BODY_BYTES = 32 << 20


def build_router_app(
    registry: Registry | None = None, max_local_prefill_length: int = 0, register_token: str = ""
) -> FastAPI:
    """`register_token`: when set, /register takes only heartbeats carrying it (REGISTER_TOKEN_HEADER)."""
    registry = registry or Registry()
    timeout = httpx.Timeout(None, connect=CONNECT_TIMEOUT_S)
    limits = httpx.Limits(max_connections=1024, max_keepalive_connections=64)
    client = httpx.AsyncClient(timeout=timeout, limits=limits)

    @contextlib.asynccontextmanager
    async def lifespan(_app):
        yield
        await client.aclose()

    app = FastAPI(title="fd router", docs_url=None, redoc_url=None, lifespan=lifespan)
    proxy = PDProxy(registry, client, max_local_prefill_length)
    app.state.registry = registry

    @app.post("/register")
    async def register(request: Request) -> Response:
        if not token_accepted(register_token, request.headers.get(REGISTER_TOKEN_HEADER)):
            return error_response(
                401, f"/register needs the instances' shared token in {REGISTER_TOKEN_HEADER}"
            )
        body = await _json_body(request)
        if isinstance(body, Response):
            return body
        role, url, kv = body.get("role"), body.get("url"), body.get("kv_address") or ""
        if role not in ROLES:
            return error_response(400, f"role must be one of {', '.join(ROLES)}, got {role!r}")
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            return error_response(400, "url must be the instance's http:// address")
        if role == "decode" and not (isinstance(kv, str) and kv.startswith(("tcp://", "ipc://"))):
            return error_response(400, "a decode instance registers its kv_address (tcp:// or ipc://)")
        registry.register(role, url, kv)
        return JSONResponse({"status": "ok"})

    @app.get("/instances")
    async def instances() -> Response:
        return JSONResponse({"instances": [i.describe() for i in registry.live()]})

    @app.get("/health")
    async def health() -> Response:
        live = registry.live()
        probes = await asyncio.gather(*(_probe(client, i.url + "/health") for i in live))
        report = []
        for inst, ok in zip(live, probes):
            if not ok:
                registry.forget(inst)
            report.append({**inst.describe(), "healthy": ok})
        roles = {i.role for i, ok in zip(live, probes) if ok}
        ok = {"prefill", "decode"} <= roles or "mixed" in roles
        return JSONResponse(
            {"status": "ok" if ok else "unavailable", "instances": report}, 200 if ok else 503
        )

    @app.get("/metrics")
    async def metrics(request: Request) -> Response:
        live = registry.live()
        pages = await asyncio.gather(*(_get_text(client, i.url + "/metrics", request.headers) for i in live))
        merged = merge_metrics({i.url: p for i, p in zip(live, pages) if p is not None})
        return PlainTextResponse(merged + _router_metrics(proxy))

    @app.get("/v1/models")
    async def models(request: Request) -> Response:
        for inst in registry.live("decode") + registry.live("prefill") + registry.live("mixed"):
            try:
                r = await client.get(inst.url + "/v1/models", headers=forwarded(request.headers))
            except httpx.TransportError:
                registry.forget(inst)
                continue
            return Response(r.content, r.status_code, media_type="application/json")
        return error_response(503, "no instance is registered with the router")

    for path in GENERATION_ROUTES:
        app.add_api_route(path, _generation(proxy, path), methods=["POST"])

    return app


def _generation(proxy: PDProxy, path: str):
    async def route(request: Request) -> Response:
        body = await _json_body(request)
        if isinstance(body, Response):
            return body
        return await proxy.handle(path, body, forwarded(request.headers), request.is_disconnected)

    route.__name__ = path.strip("/").replace("/", "_")
    return route


def _router_metrics(proxy: PDProxy) -> str:
    name = "fd:router_local_prefill_total"
    return (
        f"# HELP {name} Requests the decode instance prefilled itself (--max-local-prefill-length)\n"
        f"# TYPE {name} counter\n{name} {proxy.local_prefills}\n"
    )


async def _json_body(request: Request) -> dict | Response:
    raw = await request.body()
    if len(raw) > MAX_BODY_BYTES:
        return error_response(413, f"the request body exceeds {MAX_BODY_BYTES >> 20} MiB")
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        return error_response(400, "the request body is not valid JSON")
    if not isinstance(body, dict):
        return error_response(400, "the request body must be a JSON object")
    return body


async def _probe(client: httpx.AsyncClient, url: str) -> bool:
    try:
        return (await client.get(url, timeout=PROBE_TIMEOUT_S)).status_code == 200
    except httpx.HTTPError:
        return False


async def _get_text(client: httpx.AsyncClient, url: str, headers) -> str | None:
    try:
        r = await client.get(url, headers=forwarded(headers), timeout=PROBE_TIMEOUT_S)
    except httpx.HTTPError:
        return None
    return r.text if r.status_code == 200 else None
