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
# FastDeploy's router flags (fastdeploy/router/router.py RouterArgs), so its launch lines run.
SplitwiseOpt = Annotated[
    bool,
    typer.Option(
        "--splitwise",
        help="FastDeploy's flag; no effect: fd's router pairs prefill and decode instances when both are "
        "registered and serves mixed ones otherwise.",
    ),
]
RequestTimeoutOpt = Annotated[
    Optional[int],
    typer.Option(
        "--request-timeout-secs",
        help="FastDeploy's flag; no effect: fd's router waits for an instance as long as the client does "
        "(a dead instance fails its requests at once).",
    ),
]
SPLITWISE_NOTE = (
    "--splitwise has no effect: fd's router pairs prefill and decode instances whenever both are "
    "registered, and serves mixed instances otherwise"
)
TIMEOUT_NOTE = (
    "--request-timeout-secs has no effect: fd's router waits for an instance as long as the client does; "
    "a dead instance fails its requests at once"
)


def router(
    host: HostOpt = "127.0.0.1",
    port: PortOpt = 9000,
    max_local_prefill_length: LocalPrefillOpt = None,
    kv_transfer_token: TokenOpt = None,
    splitwise: SplitwiseOpt = False,
    request_timeout_secs: RequestTimeoutOpt = None,
) -> None:
    """Route OpenAI requests through prefill and decode instances (FastDeploy's splitwise router)."""
    if not 0 < port < 65536:
        fail(f"--port must be between 1 and 65535, got {port}", 2)
    if request_timeout_secs is not None and request_timeout_secs <= 0:
        fail(f"--request-timeout-secs must be positive, got {request_timeout_secs}", 2)
    if splitwise:
        typer.echo(f"fd router: {SPLITWISE_NOTE}", err=True)
    if request_timeout_secs is not None:
        typer.echo(f"fd router: {TIMEOUT_NOTE}", err=True)
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
