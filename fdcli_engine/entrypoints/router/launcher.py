"""Run `fd router`: bind first (a taken port is one line, not a traceback), then serve with uvicorn."""

from __future__ import annotations

import logging

from fdcli_engine.entrypoints.listen_socket import bind_socket
from fdcli_engine.log_files import quiet_http_client


def run_router(host: str, port: int, max_local_prefill_length: int = 0, register_token: str = "") -> int:
    import uvicorn

    from fdcli_engine.entrypoints.router.app import build_router_app

    logging.basicConfig(level=logging.INFO, format="%(asctime)s fd router %(levelname)s %(message)s")
    quiet_http_client()
    sock = bind_socket(host, port)
    config = uvicorn.Config(
        build_router_app(max_local_prefill_length=max_local_prefill_length, register_token=register_token),
        log_level="warning",
        timeout_graceful_shutdown=5,
    )
    server = uvicorn.Server(config)
    local = (
        f", prompts of <= {max_local_prefill_length} tokens prefilled locally"
        if max_local_prefill_length
        else ""
    )
    print(f"fd router: listening on http://{host}:{port}{local}", flush=True)
    try:
        server.run(sockets=[sock])
    finally:
        sock.close()
    return 0
