"""`fd router`: the front door of a prefill/decode deployment. Instances started with
`fd serve --splitwise-role prefill|decode --router HOST:PORT` register with it and heartbeat; it runs
each OpenAI request through a prefill and a decode instance (docs/disaggregation.md)."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from fdcli.console import error_boundary, fail

HostOpt = Annotated[str, typer.Option("--host", help="Address to listen on.")]
PortOpt = Annotated[int, typer.Option("--port", help="Port to listen on.")]
# Text, parsed here: a bad value is one line on stderr (local_prefill.parse_max_local_prefill_length).
LocalPrefillOpt = Annotated[
    Optional[str],
    typer.Option(
        "--max-local-prefill-length",
        metavar="TOKENS",
        help="Prompts of at most this many tokens are prefilled by the decode instance itself "
        "(no prefill instance, no KV transfer); 0 (default): every prompt goes through a prefill instance.",
    ),
]

TokenOpt = Annotated[
    Optional[str],
    typer.Option(
        "--kv-transfer-token",
        envvar="FD_KV_TRANSFER_TOKEN",
        show_envvar=True,
        help="The instances' shared token: /register then takes only heartbeats that carry it. "
        "Required when --host is not a loopback address.",
    ),
]


def router(
    host: HostOpt = "127.0.0.1",
    port: PortOpt = 9000,
    max_local_prefill_length: LocalPrefillOpt = None,
    kv_transfer_token: TokenOpt = None,
) -> None:
    """Route OpenAI requests through prefill and decode instances (FastDeploy's splitwise router)."""
    if not 0 < port < 65536:
        fail(f"--port must be between 1 and 65535, got {port}", 2)
    from fdcli_engine.entrypoints.router.local_prefill import parse_max_local_prefill_length
    from fdcli_engine.errors import ConfigError
    from fdcli_engine.kv_transfer.pd.settings import check_router_bind

    token = kv_transfer_token or ""
    try:
        check_router_bind(host, token)
    except ConfigError as e:
        fail(e, 2)

    try:
        local = parse_max_local_prefill_length(max_local_prefill_length)
    except ValueError as e:
        fail(e, 2)
    from fdcli_engine.entrypoints.router.launcher import run_router

    with error_boundary():
        code = run_router(host, port, local, token)
    if code:
        raise typer.Exit(code)
