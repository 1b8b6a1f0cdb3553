"""The FastAPI app: the route table (routes.py) mapped onto HTTP, the info routes (models, health,
ready, version, metrics), error rendering and the auth/size/drain middleware. Business logic lives in
the framework-free serving layer (serving_layer.py); this file only moves HTTP in and out of it."""

from __future__ import annotations

import asyncio
import inspect
import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from fdcli_engine.entrypoints.openai.app_state import ServerArgs, key_matches, shutting_down
from fdcli_engine.entrypoints.openai.errors import APIError, from_exception, status_phrase
from fdcli_engine.entrypoints.openai.json_depth import DEEP, too_deep_field
from fdcli_engine.entrypoints.openai.metrics import ServerMetrics
from fdcli_engine.entrypoints.openai.primed_stream import PrimedStream
from fdcli_engine.entrypoints.openai.protocol import ErrorResponse, ModelCard, ModelList
from fdcli_engine.entrypoints.openai.request_fields import HEADER as IGNORED_HEADER
from fdcli_engine.entrypoints.openai.request_fields import (
    IgnoredFieldsLog,
    header_value,
    unknown_fields,
    unrecognized,
)
from fdcli_engine.entrypoints.openai.routes import ROUTES, Route
from fdcli_engine.entrypoints.openai.serving_layer import ServingLayer, build_serving, served_names
from fdcli_engine.entrypoints.openai.validation import validation_error
from fdcli_engine.pooling.encoding import PoolingBytes

logger = logging.getLogger("fd.serve")
OPEN_PATHS = {"/health", "/ping"}  # the probes need no key
_ERRORS = {code: {"model": ErrorResponse} for code in (400, 401, 404, 413, 429, 503)}
# What /openapi.json says beyond the models: a route that may stream answers 200 with either JSON or
# server-sent events; the probes answer an empty 200 or an error object.
_STREAMED = {
    200: {
        "description": "The response; with stream=true, server-sent events (`data: {chunk}` ... `data: [DONE]`)",
        "content": {"text/event-stream": {}},  # each event: one chunk object, then [DONE]
    }
}
_AUTH = {401: {"model": ErrorResponse}}
_METRICS = {
    200: {"description": "Prometheus' text format", "content": {"text/plain": {"schema": {"type": "string"}}}}
}
_PROBE = {200: {"description": "Serving (empty body)", "content": {}}, 503: {"model": ErrorResponse}}


def error_response(err: APIError) -> JSONResponse:
    return JSONResponse(err.to_dict(), status_code=err.status, headers=err.headers)


class GuardMiddleware:
    """Pure ASGI: 503 while draining, 401 without a valid key, 413 for a body over the limit.

    The body is read here (up to the limit) and replayed to the app, so an oversized body is refused
    before any parsing; after the replay `receive` passes through, so disconnects still reach the app.
    """

    def __init__(self, app, state):
        self.app = app
        self.state = state

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        st = self.state
        if st.draining:
            return await error_response(shutting_down())(scope, receive, send)
        if st.args.api_keys and scope["path"] not in OPEN_PATHS and not _authorized(scope, st.args.api_keys):
            err = APIError("missing or invalid API key", 401, code="invalid_api_key")
            return await error_response(err)(scope, receive, send)
        if scope["method"] in ("POST", "PUT", "PATCH"):
            limit = st.args.max_request_body_bytes
            length = dict(scope["headers"]).get(b"content-length")
            if length is not None and length.isdigit() and int(length) > limit:
                return await error_response(_too_large(limit))(scope, receive, send)
            body, more = bytearray(), True
            while more:
                msg = await receive()
                if msg["type"] == "http.disconnect":
                    return
                body += msg.get("body", b"")
                more = msg.get("more_body", False)
                if len(body) > limit:
                    return await error_response(_too_large(limit))(scope, receive, send)
            receive = _replay(bytes(body), receive)
            scope["fd.body"] = body  # for the error handler: which field nests too deep to parse
        await self.app(scope, receive, send)


def _too_large(limit: int) -> APIError:
    return APIError(f"the request body exceeds the limit of {limit} bytes", 413)


def _authorized(scope, keys: list[str]) -> bool:
    headers = dict(scope["headers"])
    auth = headers.get(b"authorization", b"").decode("latin-1")
    scheme, _, token = auth.partition(" ")
    if scheme.lower() == "bearer" and token:
        return key_matches(token.strip(), keys)
    return b"x-api-key" in headers and key_matches(headers[b"x-api-key"].decode("latin-1"), keys)


def _replay(body: bytes, receive):
    sent = False

    async def replayed():
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replayed


class ClosingStreamingResponse(StreamingResponse):
    """Runs `on_close` exactly once however the response ends (client gone, error, or never started:
    a generator that was never iterated would not run its own `finally`), so the stream's requests
    are aborted in the engine and its admission slot is returned at once, not at garbage collection."""

    def __init__(self, content, on_close, **kw):
        super().__init__(content, **kw)
        self._on_close = on_close

    async def __call__(self, scope, receive, send):
        try:
            await super().__call__(scope, receive, send)
        finally:
            on_close, self._on_close = self._on_close, None
            if on_close is not None:
                await on_close()


async def _until_disconnect(request: Request, coro):
    """Run `coro`; if the client disconnects first, cancel it (its generators abort their requests)."""
    task = asyncio.ensure_future(coro)
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=0.25)
            if done:
                return task.result()
            if await request.is_disconnected():
                task.cancel()
                raise APIError("client disconnected", 499)
    finally:
        if not task.done():
            task.cancel()


def _fd_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("fd-llm")
    except PackageNotFoundError:
        return "0+unknown"


class _Ctx:
    """What the route handlers share: the engine, server state, metrics and the serving layer."""

    def __init__(self, engine, layer: ServingLayer, state, metrics: ServerMetrics):
        self.engine = engine
        self.state = state
        self.metrics = metrics
        self.layer = layer
        self.ignored_fields = IgnoredFieldsLog()

    def require_ready(self) -> None:
        if self.engine.is_dead:
            raise APIError(f"the engine is not running: {self.engine.dead_reason}", 503)
        if not self.engine.is_ready:
            raise APIError("the engine is still loading the model", 503, headers={"Retry-After": "5"})

    async def run(self, request: Request, create):
        """Readiness, admission (429) and disconnect handling around one serving call. A streaming
        result keeps its admission slot until the stream ends."""
        self.require_ready()
        admission = self.state.admission
        self.metrics.queue.observe(await admission.acquire())
        self.metrics.engine.num_http_inflight = admission.inflight
        try:
            result = await _until_disconnect(request, create())
        except BaseException:
            admission.release()
            raise
        if not hasattr(result, "__aiter__"):
            admission.release()
            return result
        result = PrimedStream(result)

        async def close() -> None:
            try:
                await result.aclose()  # runs the serving generator's finally: aborts unfinished requests
            finally:
                admission.release()

        return ClosingStreamingResponse(result, close, media_type="text/event-stream")


def build_app(engine, args: ServerArgs, state) -> FastAPI:
    """`state` has .args, .draining, .admission; `engine` implements the EngineClient protocol."""
    docs = {"openapi_url": None, "docs_url": None, "redoc_url": None} if args.disable_fastapi_docs else {}
    app = FastAPI(title="fd OpenAI-compatible server", version=_fd_version(), **docs)
    metrics = ServerMetrics(served_names(engine, args.serving)[0], engine.model_config.max_model_len)
    ctx = _Ctx(engine, build_serving(engine, args.serving, metrics), state, metrics)
    app.add_middleware(GuardMiddleware, state=state)
    _add_cors(app, args)  # after the guard, so outside it: a preflight never meets the key check
    if args.enable_request_id_headers:  # outermost: every answer gets it, the guard's and CORS' too
        from fdcli_engine.entrypoints.openai.request_id_header import RequestIdHeader

        app.add_middleware(RequestIdHeader)
    _add_error_handlers(app)
    for url, route in ROUTES.items():
        responses = _ERRORS if route.response_model is not None else {**_ERRORS, **_STREAMED}
        app.post(url, response_model=route.response_model, responses=responses)(_endpoint(route, ctx))
    _add_info_routes(app, ctx)
    _add_stored_response_routes(app)
    app.state.metrics = ctx.metrics
    return app


def _add_cors(app: FastAPI, args: ServerArgs) -> None:
    """starlette's CORSMiddleware when --allowed-origins is given. It answers a preflight (OPTIONS
    with Access-Control-Request-Method) itself, which browsers send without the API key; the actual
    request still needs the key."""
    if args.allowed_origins is None:
        return
    from starlette.middleware.cors import CORSMiddleware

    app.add_middleware(
        CORSMiddleware,
        allow_origins=args.allowed_origins,
        allow_methods=args.allowed_methods,
        allow_headers=args.allowed_headers,
        allow_credentials=args.allow_credentials,
    )


def _endpoint(route: Route, ctx: _Ctx):
    """The FastAPI handler of one route: the body validated by its request model, then the serving
    call (through `ctx.run` for an admitted route)."""
    layer = ctx.layer
    strict = ctx.state.args.serving.strict_request_fields

    async def endpoint(req, request: Request, response: Response):
        ignored = _ignored_fields(ctx, req, strict, request.url.path)
        if not route.admitted:
            result = await route.call(layer, req)
        else:
            result = await ctx.run(request, lambda: route.call(layer, req))
        if isinstance(result, PoolingBytes):
            headers = {"metadata": result.metadata} if result.metadata is not None else None
            result = Response(result.content, media_type=result.media_type, headers=headers)
        if ignored:
            # A stream is its own Response; a model gets the headers FastAPI copies from `response`.
            (result if isinstance(result, Response) else response).headers[IGNORED_HEADER] = header_value(
                ignored
            )
        return result

    endpoint.__name__ = route.name
    endpoint.__signature__ = inspect.Signature(
        [
            inspect.Parameter("req", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=route.request_model),
            inspect.Parameter("request", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=Request),
            inspect.Parameter("response", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=Response),
        ]
    )
    return endpoint


def _ignored_fields(ctx: _Ctx, req, strict: bool, route: str) -> list[str]:
    """The request's unknown fields (logged once each), or OpenAI's 400 for the first when strict."""
    fields = unknown_fields(req)
    if fields and strict:
        raise unrecognized(fields[0])
    if fields:
        ctx.ignored_fields.note(fields, route)
    return fields


def _add_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def _api_error(_req, exc: APIError):
        return error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def _validation(_req, exc: RequestValidationError):
        return error_response(validation_error(exc.errors()))

    @app.exception_handler(StarletteHTTPException)
    async def _http(req, exc: StarletteHTTPException):
        if exc.status_code == 400 and exc.detail == "There was an error parsing the body":
            field = too_deep_field(bytes(req.scope.get("fd.body") or b""))
            if field is not None:  # the JSON parser's recursion limit: name the field
                top = field.split(".")[0]
                if top == "structured_outputs":
                    top = ".".join(field.split(".")[:2])
                message = f"{field} nests deeper than {DEEP} levels: the request body cannot be parsed"
                return error_response(APIError(message, 400, param=top))
        return error_response(APIError(str(exc.detail or status_phrase(exc.status_code)), exc.status_code))

    @app.exception_handler(Exception)
    async def _unexpected(_req, exc: Exception):
        logger.exception("unhandled error")
        return error_response(from_exception(exc))


def _add_stored_response_routes(app: FastAPI) -> None:
    """vLLM's routes over stored responses (retrieve, delete, cancel, input items): fd stores none
    (`store` is accepted and ignored, as vLLM does without VLLM_ENABLE_RESPONSES_API_STORE), so
    every id is vLLM's 404, saying why."""

    async def not_stored(response_id: str):
        raise APIError(
            f"response {response_id!r} not found: fd stores no responses (store is ignored); keep the "
            "Response the create call returned, and send the conversation again in input",
            404,
            param="response_id",
        )

    app.api_route("/v1/responses/{response_id}", methods=["GET", "DELETE"], responses=_ERRORS)(not_stored)
    app.post("/v1/responses/{response_id}/cancel", responses=_ERRORS)(not_stored)
    app.get("/v1/responses/{response_id}/input_items", responses=_ERRORS)(not_stored)


def _add_info_routes(app: FastAPI, ctx: _Ctx) -> None:
    engine, names = ctx.engine, ctx.layer.served_model_names

    @app.get("/v1/models", response_model=ModelList, responses=_AUTH)
    async def list_models():
        cfg = engine.model_config
        return ModelList(
            data=[ModelCard(id=n, root=cfg.model, max_model_len=cfg.max_model_len) for n in names]
        )

    @app.get("/v1/models/{model_id:path}", response_model=ModelCard, responses=_ERRORS)
    async def retrieve_model(model_id: str):
        """One served model's card (OpenAI's GET /v1/models/{model}); ids may contain slashes."""
        if model_id not in names:
            raise APIError(
                f"the model {model_id!r} does not exist; this server serves {', '.join(names)}",
                404,
                param="model",
                code="model_not_found",
            )
        cfg = engine.model_config
        return ModelCard(id=model_id, root=cfg.model, max_model_len=cfg.max_model_len)

    @app.get("/health", response_class=Response, responses=_PROBE)
    async def health():
        """200 once the engine serves; 503 while it still loads the model (like vLLM, whose server only
        answers once its engine is ready, so `until curl -sf /health` scripts and readiness probes wait)
        and once no engine core serves. With data parallelism a dead rank while others serve is
        "degraded": still 200 (the server answers requests, so a probe must not take it out), with a
        body naming each dead rank and why (fd:data_parallel_rank_alive says it too)."""
        ctx.require_ready()
        dead = getattr(engine, "dead_ranks", None)
        if dead:
            ranks = [{"rank": r, "reason": why} for r, why in sorted(dead.items())]
            return JSONResponse({"status": "degraded", "dead_ranks": ranks}, status_code=200)
        return Response(status_code=200)

    @app.get("/load", responses=_AUTH)
    async def load():
        """vLLM's server load: the requests being served (admitted, response not finished) under
        --enable-server-load-tracking, else 0 (as vLLM, which counts only then)."""
        tracking = ctx.state.args.enable_server_load_tracking
        return JSONResponse({"server_load": ctx.state.admission.inflight if tracking else 0})

    # vLLM answers /ping (SageMaker's probe) on GET and POST alike.
    @app.api_route("/ping", methods=["GET", "POST"], response_class=Response, responses=_PROBE)
    async def ping():
        return await health()

    @app.get("/ready", responses={**_AUTH, 503: {"model": ErrorResponse}})
    async def ready():
        ctx.require_ready()
        return {"status": "ready", "model": names[0]}

    @app.get("/version", responses=_AUTH)
    async def version():
        return {"version": app.version}

    @app.get("/metrics", responses={**_AUTH, **_METRICS})
    async def get_metrics():
        stats = None
        if engine.is_ready:
            try:
                stats = await engine.get_stats()
            except Exception as e:  # stale gauges beat a failed scrape
                logger.warning("could not read engine stats: %s", e)
        ctx.metrics.engine.num_http_inflight = ctx.state.admission.inflight
        return Response(ctx.metrics.render(stats), media_type="text/plain; version=0.0.4; charset=utf-8")

    app.state.metrics_endpoint = get_metrics  # --metrics-port serves the same handler


def build_metrics_app(app: FastAPI) -> FastAPI:
    """FastDeploy's metrics server (--metrics-port): `app`'s /metrics alone, without the auth middleware,
    so Prometheus can scrape a server whose API needs a key; the same registry as `app`'s /metrics."""
    metrics_app = FastAPI(title="fd metrics", openapi_url=None, docs_url=None, redoc_url=None)
    metrics_app.get("/metrics")(app.state.metrics_endpoint)
    return metrics_app
