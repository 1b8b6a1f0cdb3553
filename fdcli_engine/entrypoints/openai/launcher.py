"""`fd serve` process lifecycle: bind, spawn the engine core, run uvicorn, drain on SIGTERM, exit.

Exit codes: 0 after a signal-initiated shutdown, 1 when the engine core died or failed to start.
Shutdown invariant: once draining starts every new request gets 503; running requests get up to
`timeout_graceful_shutdown` seconds, then are aborted (their streams end with finish_reason "abort");
the engine process is always reaped before this process exits.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import logging
import socket
import sys
from dataclasses import replace
from pathlib import Path

import uvicorn

from fdcli_engine.config import EngineConfig
from fdcli_engine.config_resolver import resolve_config
from fdcli_engine.entrypoints.event_loop import event_loop_runner
from fdcli_engine.entrypoints.listen_socket import bind_socket
from fdcli_engine.entrypoints.openai.app_state import Admission, AppState, ServerArgs
from fdcli_engine.entrypoints.openai.http_app import build_app, build_metrics_app
from fdcli_engine.entrypoints.openai.http_guard import FramingLimits, fit_open_files, guarded_protocol
from fdcli_engine.entrypoints.openai.serving_options import (
    check_serving_options,
    default_served_name,
    load_chat_template,
)
from fdcli_engine.errors import ConfigError
from fdcli_engine.log_files import CONSOLE_LOGGER, SERVER_LOG, configure_logging
from fdcli_engine.resolved_config import ResolvedConfig
from fdcli_engine.threads import FrontEndPlacement, front_end_placement, place_front_end

logger = logging.getLogger("fd.serve")
DEAD_ENGINE_EXIT_DELAY_S = 3.0  # keep /health answering 503 this long before exiting


class FdServer(uvicorn.Server):
    """uvicorn's server with fd's signal handling: the first SIGTERM/SIGINT drains, a second one forces."""

    def __init__(self, config, state: AppState, engine):
        super().__init__(config)
        self.fd_state = state
        self.engine = engine
        self.exit_code = 0
        self._drain_task = None

    def handle_exit(self, sig, frame) -> None:
        if self.fd_state.draining:
            self.force_exit = True
            self.should_exit = True
            return
        self.fd_state.draining = True
        loop = asyncio.get_event_loop()
        loop.call_soon_threadsafe(self.fd_state.admission.close)
        loop.call_soon_threadsafe(lambda: setattr(self, "_drain_task", loop.create_task(self.drain())))

    async def drain(self) -> None:
        adm = self.fd_state.admission
        timeout = self.fd_state.args.timeout_graceful_shutdown
        logger.warning("draining: %d request(s) in flight, up to %.0fs", adm.inflight, timeout)
        try:
            await asyncio.wait_for(adm.idle.wait(), timeout)
        except asyncio.TimeoutError:
            aborted = self.engine.abort_all()
            logger.warning("graceful timeout: aborted %d request(s)", len(aborted))
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(adm.idle.wait(), 5.0)
        self.should_exit = True

    def engine_died(self) -> None:
        self.exit_code = 1
        # While serving, /health answers 503 for a while first; an engine that never started: exit now.
        delay = DEAD_ENGINE_EXIT_DELAY_S if self.engine.was_ready else 0.0
        asyncio.get_event_loop().call_later(delay, lambda: setattr(self, "should_exit", True))


class MetricsServer(uvicorn.Server):
    """FastDeploy's metrics server (--metrics-port), in the API server's event loop. It leaves the
    signals to the API server (FdServer), which stops it after its own shutdown."""

    @contextlib.contextmanager
    def capture_signals(self):
        yield


async def serve_async(
    engine_config: EngineConfig,
    args: ServerArgs,
    sock: socket.socket,
    placement: FrontEndPlacement,
    metrics_sock: socket.socket | None = None,
    **hooks,
) -> int:
    from fdcli_engine.api.async_llm import AsyncLLM
    from fdcli_engine.tokenizer import load_tokenizer

    tokenizer = hooks.pop("tokenizer", None) or load_tokenizer(engine_config)
    engine = AsyncLLM(
        engine_config,
        tokenizer,
        served_model_name=(args.serving.served_model_names or [None])[0]
        or default_served_name(engine_config),
        **hooks,
    )
    state = AppState(args, Admission(args.max_concurrency, args.max_waiting_time, args.max_queue_size))
    app = build_app(engine, args, state)
    server = FdServer(uvicorn_config(app, args), state, engine)
    metrics_server = MetricsServer(uvicorn_config(build_metrics_app(app), args)) if metrics_sock else None
    engine.add_dead_listener(lambda _reason: server.engine_died())
    await engine.start()
    # After the core has started (a child inherits its parent's CPUs and priority): the front end moves
    # off the CPU of the core's main thread and yields to the core's threads (threads.front_end_placement).
    place_front_end(placement)
    logger.info("front end: CPUs %s, priority %s", placement.cpus or "any", placement.priority)
    url = f"{'https' if args.ssl_certfile else 'http'}://{args.host}:{args.port}"
    _say(
        f"fd serve: {engine.model_config.served_model_name} ({engine.config.model}) on {url}"
        f"{_speculation(engine.config)} — engine loading"
    )
    if args.disable_uvicorn_access_log:
        from fdcli_engine.vllm_compat import ACCESS_LOG_NOTE

        logger.warning(ACCESS_LOG_NOTE)
    if metrics_sock is not None:
        _say(f"fd serve: /metrics also on http://{args.host}:{args.metrics_port}/metrics (no API key)")
    asyncio.get_running_loop().create_task(_announce_ready(engine, url))
    beat = None
    if engine.config.router:  # a prefill/decode instance: register with `fd router` and heartbeat
        from fdcli_engine.entrypoints.openai.router_heartbeat import heartbeat

        beat = asyncio.get_running_loop().create_task(heartbeat(engine, engine.config, args.host, args.port))
    # Everything built so far (app, routes, schemas, tokenizer) lives as long as the server: frozen, the
    # cyclic GC stops re-scanning it in the collections that streaming's many small objects trigger
    # (7.5% of the front end's CPU at concurrency 16 went to gc before; bench_serve_frontend.py).
    gc.collect()
    gc.freeze()
    metrics_task = None
    try:
        if metrics_server is not None:
            metrics_task = asyncio.get_running_loop().create_task(
                metrics_server.serve(sockets=[metrics_sock])
            )
        await server.serve(sockets=[sock])
    finally:
        if beat is not None:
            beat.cancel()  # the router forgets this instance within its heartbeat TTL
        if metrics_task is not None:
            metrics_server.should_exit = True
            await metrics_task
        await engine.shutdown()
    if server.exit_code and engine.dead_reason:
        _say(f"Error: {' '.join(engine.dead_reason.split())}")  # the last line says why, on one line
    return server.exit_code


async def _announce_ready(engine, url: str) -> None:
    await engine.ready_event.wait()
    if engine.is_ready:
        _say(f"fd serve: engine ready; try  curl {url}/v1/models")


def _speculation(config: ResolvedConfig) -> str:
    """The start-up line's words for --speculative-config (nothing without it)."""
    spec = config.speculative_config
    return f", speculative decoding: {spec.describe()}" if spec is not None else ""


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)
    logging.getLogger(CONSOLE_LOGGER).info(line)  # into FD_LOG_DIR's api_server.log, when set


def uvicorn_config(app, args: ServerArgs, protocol: type | None = None) -> uvicorn.Config:
    """`protocol`: uvicorn's HTTP protocol class to guard (default: http_protocol()'s)."""
    limits = framing_limits(args)
    return uvicorn.Config(
        app,
        http=guarded_protocol(protocol or http_protocol_class(), limits),
        # h11's own cap stays above the guard's (which counts before h11 sees a byte), so an oversized
        # head gets the guard's 431, not h11's 400; the slack covers one read past the head's end.
        h11_max_incomplete_event_size=limits.max_head_bytes + (1 << 20),
        timeout_keep_alive=args.timeout_keep_alive,
        # No route speaks WebSocket; an upgrade would hand the socket to a protocol outside the guard.
        ws="none",
        log_level=args.uvicorn_log_level,
        timeout_graceful_shutdown=5,
        access_log=False,  # always: --disable-uvicorn-access-log says so (vllm_compat.ACCESS_LOG_NOTE)
        root_path=args.root_path,
        lifespan="off",
        ssl_keyfile=args.ssl_keyfile,
        ssl_certfile=args.ssl_certfile,
        ssl_ca_certs=args.ssl_ca_certs,
        ssl_cert_reqs=args.ssl_cert_reqs,
        ssl_ciphers=args.ssl_ciphers,
        # uvicorn's own logging setup unless --log-config-file replaces it (for fd's loggers too)
        **({"log_config": read_log_config(args.log_config_file)} if args.log_config_file else {}),
    )


def read_log_config(path: str | None) -> dict | None:
    """vLLM's --log-config-file: a logging.config.dictConfig JSON object (ConfigError if unreadable)."""
    if path is None:
        return None
    try:
        config = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"--log-config-file {path!r}: {getattr(exc, 'strerror', None) or exc}") from None
    if not isinstance(config, dict):
        raise ConfigError(f"--log-config-file {path!r} must hold a JSON object (logging.config.dictConfig)")
    return config


def http_protocol() -> str:
    """uvicorn's HTTP/1.1 implementation: httptools (llhttp, in C) when it is installed, else h11 (pure
    Python). Every streamed chunk passes through it; httptools' send path costs the front end less CPU
    per chunk. Both are complete implementations, so the fallback changes speed, not behaviour."""
    try:
        import httptools  # noqa: F401
    except ImportError:
        return "h11"
    return "httptools"


def http_protocol_class() -> type:
    from uvicorn.config import HTTP_PROTOCOLS
    from uvicorn.importer import import_from_string

    return import_from_string(HTTP_PROTOCOLS[http_protocol()])


def framing_limits(args: ServerArgs) -> FramingLimits:
    return FramingLimits(
        max_head_bytes=args.h11_max_incomplete_event_size,
        max_header_count=args.h11_max_header_count,
        head_timeout=args.timeout_request_header,
        body_timeout=args.timeout_request_body,
        max_connections=args.max_connections,
    )


def run_server(engine_config: EngineConfig | ResolvedConfig, args: ServerArgs, **hooks) -> int:
    """Blocking entry point of `fd serve`. Raises ConfigError (port in use, bad option) before serving.
    An EngineConfig is resolved here, once; a ResolvedConfig (a stub core's) is used as given."""
    configure_logging("%(asctime)s fd %(levelname)s %(message)s", SERVER_LOG)
    # Option values first: a bad parser is refused before the model is looked for or read.
    args.serving = replace(args.serving, chat_template=load_chat_template(args.serving.chat_template))
    check_serving_options(args.serving)
    if isinstance(engine_config, EngineConfig) and (engine_config.nnodes > 1 or engine_config.ips):
        engine_config = resolve_config(engine_config)  # which node this is decides what it runs
        if engine_config.node_rank > 0:
            from fdcli_engine.runner.tp_node import run_worker_node  # noqa: PLC0415

            return run_worker_node(engine_config)
    sock = bind_socket(args.host, args.port)
    metrics_sock = None
    try:
        if args.metrics_port is not None:
            metrics_sock = bind_socket(args.host, args.metrics_port, "--metrics-port")
        if isinstance(engine_config, EngineConfig):
            engine_config = resolve_config(engine_config)
        if engine_config.distributed_executor_backend == "ray":
            raise ConfigError(
                "--distributed-executor-backend ray is for fd run-batch; fd serve runs its engines as "
                "processes on this machine (mp)"
            )
        fit_open_files(args.max_connections + (args.max_connections if metrics_sock else 0))
        placement = front_end_placement(engine_config.num_threads)
        with event_loop_runner() as runner:
            return runner.run(serve_async(engine_config, args, sock, placement, metrics_sock, **hooks))
    finally:
        sock.close()
        if metrics_sock is not None:
            metrics_sock.close()
