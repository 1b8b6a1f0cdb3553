"""A prefill or decode instance's registration with `fd router` (--router HOST:PORT): once the engine
is ready, POST /register every second with its role, URL and KV transfer address; the router forgets
an instance that stops. A router that is down is retried quietly (one warning per outage)."""

from __future__ import annotations

import asyncio
import logging
import os
import socket

import httpx

from fdcli_engine.kv_transfer.pd.settings import REGISTER_TOKEN_HEADER, TOKEN_ENV, transfer_address
from fdcli_engine.resolved_config import ResolvedConfig

logger = logging.getLogger("fd.server")

HEARTBEAT_S = 1.0
WILDCARD = ("", "0.0.0.0", "::")


def advertised_host(host: str) -> str:
    """What others use to reach an address bound as `host` (a wildcard: this machine's name's address)."""
    if host not in WILDCARD:
        return host
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"


def registration(config: ResolvedConfig, host: str, port: int) -> dict:
    kv = ""
    if config.splitwise_role == "decode":
        kv_host = advertised_host(config.kv_transfer_host)
        kv = transfer_address(config.cache_transfer_protocol, kv_host, config.pd_comm_port)
    return {"role": config.splitwise_role, "url": f"http://{advertised_host(host)}:{port}", "kv_address": kv}


def registration_headers() -> dict:
    """The shared token (the instance's --kv-transfer-token, kept in its environment), when it has one."""
    token = os.environ.get(TOKEN_ENV)
    return {REGISTER_TOKEN_HEADER: token} if token else {}


async def heartbeat(engine, config: ResolvedConfig, host: str, port: int) -> None:
    await engine.ready_event.wait()
    if not engine.is_ready:
        return
    router = config.router if "://" in config.router else f"http://{config.router}"
    body = registration(config, host, port)
    down = False
    async with httpx.AsyncClient(timeout=HEARTBEAT_S, headers=registration_headers()) as client:
        while not engine.is_dead:
            try:
                r = await client.post(f"{router}/register", json=body)
                r.raise_for_status()
                if down:
                    logger.info("router %s reachable again", router)
                down = False
            except httpx.HTTPError as e:
                if not down:
                    logger.warning("router %s: registration failed (%s); retrying every second", router, e)
                down = True
            await asyncio.sleep(HEARTBEAT_S)
