"""The FastAPI adapter: routes, error rendering, auth/size/drain middleware. Business logic lives in the
framework-free serving classes; this file only moves HTTP in and out of them."""

from __future__ import annotations

import asyncio
import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from fdcli_engine.entrypoints.openai.app_state import ServerArgs, key_matches
from fdcli_engine.entrypoints.openai.errors import APIError, bad_request, from_exception, status_phrase
from fdcli_engine.entrypoints.openai.metrics import ObservedEngine, ServerMetrics
from fdcli_engine.entrypoints.openai.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    DetokenizeResponse,
    ErrorResponse,
    ModelCard,
    ModelList,
    TokenizeRequest,
    TokenizeResponse,
)
from fdcli_engine.entrypoints.openai.reasoning import get_parser_cls
from fdcli_engine.entrypoints.openai.serving_chat import OpenAIServingChat
from fdcli_engine.entrypoints.openai.serving_common import check_model, encode
from fdcli_engine.entrypoints.openai.serving_completion import OpenAIServingCompletion
from fdcli_engine.entrypoints.openai.tool_parsers import get_tool_parser_cls

logger = logging.getLogger("fd.serve")
OPEN_PATHS = {"/health", "/ping"}  # liveness probes need no key
_ERRORS = {code: {"model": ErrorResponse} for code in (400, 401, 404, 413, 429, 503)}


def error_response(err: APIError) -> JSONResponse:
    return JSONResponse(err.to_dict(), status_code=err.status, headers=err.headers)


_TYPE_LABELS = {"str", "int", "float", "bool", "dict", "list", "none", "json-or-python"}


def _loc_to_param(loc) -> str | None:
    """pydantic's error location → an OpenAI `param` like `messages[0].role` (union-branch labels such
    as `list[int]` or `constrained-str` are not field names and are dropped)."""
    out = ""
    for p in loc:
        if isinstance(p, int):
            out += f"[{p}]"
        elif p in ("body", "query", "path") and not out:
            continue
        elif "[" in p or "-" in p or p in _TYPE_LABELS:
            continue
        else:
            out += f".{p}" if out else p
    return out or None


def validation_error(exc: RequestValidationError) -> APIError:
    errors = exc.errors()
    if not errors:
        return bad_request("invalid request body")
    first = errors[0]
    if first.get("type") in ("json_invalid", "model_attributes_type") and len(first.get("loc", ())) <= 2:
        return bad_request("the request body must be a JSON object")
    param = _loc_to_param(first.get("loc", ()))
    msg = first.get("msg", "invalid value")
    extra = f" ({len(errors) - 1} more problems)" if len(errors) > 1 else ""
    return bad_request(f"{param or 'body'}: {msg}{extra}", param)


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
            return await _send_error(scope, receive, send, APIError("the server is shutting down", 503))
        if st.args.api_keys and scope["path"] not in OPEN_PATHS and not _authorized(scope, st.args.api_keys):
            err = APIError("missing or invalid API key", 401, code="invalid_api_key")
            return await _send_error(scope, receive, send, err)
        if scope["method"] in ("POST", "PUT", "PATCH"):
            limit = st.args.max_request_body_bytes
            length = dict(scope["headers"]).get(b"content-length")
            if length is not None and length.isdigit() and int(length) > limit:
                return await _send_error(scope, receive, send, _too_large(limit))
            body, more = bytearray(), True
            while more:
                msg = await receive()
                if msg["type"] == "http.disconnect":
                    return
                body += msg.get("body", b"")
                more = msg.get("more_body", False)
                if len(body) > limit:
                    return await _send_error(scope, receive, send, _too_large(limit))
            receive = _replay(bytes(body), receive)
        await self.app(scope, receive, send)


def _too_large(limit: int) -> APIError:
    return APIError(f"the request body exceeds the limit of {limit} bytes", 413)


def _authorized(scope, keys: list[str]) -> bool:
    headers = dict(scope["headers"])
    auth = headers.get(b"authorization", b"").decode("latin-1")
    scheme, _, token = auth.partition(" ")
    if scheme.lower() == "bearer" and token:
        return key_matches(token.strip(), keys)
    return (
        key_matches(headers.get(b"x-api-key", b"").decode("latin-1"), keys)
        if b"x-api-key" in headers
        else False
    )


def _replay(body: bytes, receive):
    sent = False

    async def replayed():
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replayed


async def _send_error(scope, receive, send, err: APIError) -> None:
    await error_response(err)(scope, receive, send)


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
    """What the route handlers share: the engine, server state, metrics and the serving objects."""

    def __init__(self, engine, args: ServerArgs, state):
        self.engine = engine
        self.state = state
        self.metrics = ServerMetrics()
        observed = ObservedEngine(engine, self.metrics)
        self.names = args.served_model_name or [engine.model_config.served_model_name]
        self.completion = OpenAIServingCompletion(observed, self.names)
        self.chat = OpenAIServingChat(
            observed,
            self.names,
            chat_template=args.chat_template,
            reasoning_parser_cls=get_parser_cls(args.reasoning_parser),
            allow_request_chat_template=args.trust_request_chat_template,
            tool_parser_cls=get_tool_parser_cls(args.tool_call_parser),
        )

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

        async def close() -> None:
            try:
                await result.aclose()  # runs the serving generator's finally: aborts unfinished requests
            finally:
                admission.release()

        return ClosingStreamingResponse(result, close, media_type="text/event-stream")


def build_app(engine, args: ServerArgs, state) -> FastAPI:
    """`state` has .args, .draining, .admission; `engine` implements the EngineClient protocol."""
    app = FastAPI(title="fd OpenAI-compatible server", version=_fd_version())
    ctx = _Ctx(engine, args, state)
    app.add_middleware(GuardMiddleware, state=state)
    _add_error_handlers(app)
    _add_generation_routes(app, ctx)
    _add_info_routes(app, ctx)
    _add_token_routes(app, ctx)
    _add_optional_routes(app, engine, ctx.names, args, ctx.run)
    app.state.metrics = ctx.metrics
    return app


def _add_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def _api_error(_req, exc: APIError):
        return error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def _validation(_req, exc: RequestValidationError):
        return error_response(validation_error(exc))

    @app.exception_handler(StarletteHTTPException)
    async def _http(_req, exc: StarletteHTTPException):
        return error_response(APIError(str(exc.detail or status_phrase(exc.status_code)), exc.status_code))

    @app.exception_handler(Exception)
    async def _unexpected(_req, exc: Exception):
        logger.exception("unhandled error")
        return error_response(from_exception(exc))


def _add_generation_routes(app: FastAPI, ctx: _Ctx) -> None:
    @app.post("/v1/completions", responses=_ERRORS)
    async def create_completion(req: CompletionRequest, request: Request):
        return await ctx.run(request, lambda: ctx.completion.create_completion(req))

    @app.post("/v1/chat/completions", responses=_ERRORS)
    async def create_chat_completion(req: ChatCompletionRequest, request: Request):
        return await ctx.run(request, lambda: ctx.chat.create_chat_completion(req))


def _add_info_routes(app: FastAPI, ctx: _Ctx) -> None:
    engine = ctx.engine

    @app.get("/v1/models", response_model=ModelList)
    async def list_models():
        cfg = engine.model_config
        return ModelList(
            data=[ModelCard(id=n, root=cfg.model, max_model_len=cfg.max_model_len) for n in ctx.names]
        )

    @app.get("/health")
    async def health():
        if engine.is_dead:
            raise APIError(f"the engine is not running: {engine.dead_reason}", 503)
        return Response(status_code=200)

    @app.get("/ping")
    async def ping():
        return await health()

    @app.get("/ready")
    async def ready():
        ctx.require_ready()
        return {"status": "ready", "model": ctx.names[0]}

    @app.get("/version")
    async def version():
        return {"version": app.version}

    @app.get("/metrics")
    async def get_metrics():
        stats = None
        if engine.is_ready:
            try:
                stats = await engine.get_stats()
            except Exception as e:  # stale gauges beat a failed scrape
                logger.warning("could not read engine stats: %s", e)
        ctx.metrics.engine.num_http_inflight = ctx.state.admission.inflight
        return Response(ctx.metrics.render(stats), media_type="text/plain; version=0.0.4; charset=utf-8")


def _add_token_routes(app: FastAPI, ctx: _Ctx) -> None:
    engine = ctx.engine

    @app.post("/tokenize", response_model=TokenizeResponse, responses=_ERRORS)
    async def tokenize(req: TokenizeRequest):
        check_model(req.model, ctx.names)
        if (req.prompt is None) == (req.messages is None):
            raise bad_request("give exactly one of prompt or messages", "prompt")
        if req.prompt is not None:
            tokens = encode(engine.tokenizer, req.prompt, req.add_special_tokens)
        else:
            chat_req = ChatCompletionRequest(
                messages=req.messages, add_generation_prompt=req.add_generation_prompt, tools=req.tools
            )
            tokens = ctx.chat.render(chat_req)[1]
        return TokenizeResponse(
            count=len(tokens), max_model_len=engine.model_config.max_model_len, tokens=tokens
        )

    @app.post("/detokenize", response_model=DetokenizeResponse, responses=_ERRORS)
    async def detokenize(req: DetokenizeRequest):
        check_model(req.model, ctx.names)
        vocab = engine.model_config.vocab_size
        if vocab and req.tokens and max(req.tokens) >= vocab:
            raise bad_request(
                f"token id {max(req.tokens)} is outside the vocabulary (size {vocab})", "tokens"
            )
        return DetokenizeResponse(prompt=engine.tokenizer.decode(req.tokens))


def _add_optional_routes(app, engine, names, args, run) -> None:
    """Routes owned by other modules (pooling: /v1/embeddings, /v1/chat/reward), when present."""
    try:
        from fdcli_engine.entrypoints.openai.routes_pooling import add_pooling_routes
    except ModuleNotFoundError as e:
        if e.name != "fdcli_engine.entrypoints.openai.routes_pooling":
            raise
        return
    add_pooling_routes(app, engine, names, args, run, _ERRORS)
