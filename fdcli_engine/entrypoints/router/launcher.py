"""Run `fd router`: bind first (a taken port is one line, not a traceback), then serve with uvicorn."""

from __future__ import annotations

import logging
import socket

from fdcli_engine.errors import ConfigError


def run_router(host: str, port: int) -> int:
    import uvicorn

    from fdcli_engine.entrypoints.router.app import build_router_app

    logging.basicConfig(level=logging.INFO, format="%(asctime)s fd router %(levelname)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per proxied call is noise
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise ConfigError(f"cannot listen on {host}:{port}: {e.strerror}") from None
    sock.listen(1024)
    config = uvicorn.Config(build_router_app(), log_level="warning", timeout_graceful_shutdown=5)
    server = uvicorn.Server(config)
    print(f"fd router: listening on http://{host}:{port}", flush=True)
    try:
        server.run(sockets=[sock])
    finally:
        sock.close()
    return 0
