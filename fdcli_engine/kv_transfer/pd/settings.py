"""What a prefill/decode instance is: its role, where its transfer socket binds, its token, and the
bounds of its waits and staging. Leaf module: pure functions over config values, no sockets.

The token is never part of the ResolvedConfig (which reaches the engine core on its command line):
it travels in the environment, `FD_KV_TRANSFER_TOKEN`.
"""

from __future__ import annotations

import hmac
import os
import tempfile
from dataclasses import dataclass

from fdcli_engine.errors import ConfigError

ROLES = ("mixed", "prefill", "decode")
PROTOCOLS = ("ipc", "tcp")
TOKEN_ENV = "FD_KV_TRANSFER_TOKEN"
# The header an instance's /register heartbeat carries the token in, when it has one.
REGISTER_TOKEN_HEADER = "x-fd-kv-transfer-token"
TIMEOUT_ENV = "FD_KV_TRANSFER_TIMEOUT"
STAGING_ENV = "FD_KV_TRANSFER_STAGING_MB"
DEFAULT_TIMEOUT_S = 30.0
DEFAULT_STAGING_MB = 1024.0
LOOPBACK = ("127.0.0.1", "localhost", "::1")


def is_loopback(host: str) -> bool:
    return host in LOOPBACK or host.startswith("127.")


def token_accepted(expected: str, given: str | None) -> bool:
    """Whether `given` is the shared token; constant-time. No token expected: anything is accepted."""
    return not expected or hmac.compare_digest((given or "").encode(), expected.encode())


def check_router_bind(host: str, token: str) -> None:
    """ConfigError when `fd router` would take registrations from beyond this machine without a token:
    whoever registers an instance receives the prompts the router sends it."""
    if not is_loopback(host) and not token:
        raise ConfigError(
            f"--host {host} takes registrations from beyond this machine: give the instances' shared "
            f"token with --kv-transfer-token or ${TOKEN_ENV}, or bind 127.0.0.1"
        )


def transfer_protocol(value: str | None) -> str:
    """FastDeploy's --cache-transfer-protocol: one name or a comma list ("ipc,rdma"); the first that fd
    has is used, rdma is refused with what to use instead."""
    names = [n.strip().lower() for n in str(value or "ipc").split(",") if n.strip()]
    unknown = [n for n in names if n not in PROTOCOLS and n != "rdma"]
    if unknown or not names:
        raise ConfigError(f"--cache-transfer-protocol {value!r}: use ipc or tcp")
    usable = [n for n in names if n in PROTOCOLS]
    if not usable:
        raise ConfigError(
            "--cache-transfer-protocol rdma is not supported (no RDMA on this CPU build): use tcp "
            "(between hosts) or ipc (one host)"
        )
    return usable[0]


def check_pd_options(config) -> None:
    """ConfigError for an impossible prefill/decode set-up (EngineConfig.validate; pure)."""
    role = config.splitwise_role
    if role not in ROLES:
        raise ConfigError(f"--splitwise-role {role!r}: use mixed, prefill or decode")
    protocol = transfer_protocol(config.cache_transfer_protocol)
    port = config.pd_comm_port
    if port is not None and not 0 < int(port) < 65536:
        raise ConfigError(f"--pd-comm-port must be a port (1-65535), got {port}")
    if role == "mixed":
        return
    if not config.router:
        raise ConfigError(
            f"--splitwise-role {role} needs --router HOST:PORT: the `fd router` this instance registers "
            "with, which pairs prefill and decode instances"
        )
    token = config.kv_transfer_token or os.environ.get(TOKEN_ENV)
    host = config.kv_transfer_host
    if protocol == "tcp" and not is_loopback(host) and not token:
        raise ConfigError(
            f"--kv-transfer-host {host} binds the KV transfer socket beyond this machine: give a shared "
            f"token with --kv-transfer-token or ${TOKEN_ENV} (every instance the same), or bind 127.0.0.1"
        )
    if config.data_parallel_size > 1 or config.tensor_parallel_size > 1 or config.nnodes > 1:
        raise ConfigError(
            f"--splitwise-role {role} runs one engine per instance: use --data-parallel-size 1 and "
            "--tensor-parallel-size 1 (run several instances behind `fd router` instead)"
        )
    if getattr(config, "swap_space", None) or getattr(config, "kv_offload_dir", None):
        raise ConfigError(
            f"--splitwise-role {role} does not combine with --swap-space / --kv-offload-dir: an instance "
            "has one KV connector (drop the offload tier, or run this instance as mixed)"
        )
    if not config.enable_prefix_caching and role == "decode":
        raise ConfigError("--splitwise-role decode needs prefix caching (block hashes name the blocks)")


def resolve_pd_options(config) -> dict:
    """The ResolvedConfig's values of these options: a decode instance without --pd-comm-port gets a
    free port now, so the address it registers is the one it binds. The token leaves the config for
    this process's environment, which the engine core inherits (its command line is visible to all)."""
    if config.kv_transfer_token:
        os.environ[TOKEN_ENV] = config.kv_transfer_token
    protocol = transfer_protocol(config.cache_transfer_protocol)
    port = config.pd_comm_port
    if config.splitwise_role == "decode" and port is None:
        port = _free_port(config.kv_transfer_host, protocol)
    return {"pd_comm_port": port, "cache_transfer_protocol": protocol}


def _free_port(host: str, protocol: str) -> int:
    """A port free for tcp; for ipc, one whose socket file no other instance holds (an ipc socket holds
    no tcp port, so a free tcp port alone could name a live instance's file)."""
    import socket

    for _ in range(100):
        with socket.socket() as s:
            s.bind((host if is_loopback(host) else "", 0))
            port = s.getsockname()[1]
        if protocol == "tcp" or not os.path.exists(transfer_address("ipc", host, port)[len("ipc://") :]):
            return port
    raise ConfigError("no free --pd-comm-port found: give one")


def transfer_address(protocol: str, host: str, port: int | None) -> str:
    """The zmq address a decode instance binds and prefill instances send to."""
    if protocol == "tcp":
        return f"tcp://{host}:{port}"
    return f"ipc://{os.path.join(tempfile.gettempdir(), f'fd-pd-{port}.sock')}"


@dataclass(frozen=True)
class PDSettings:
    role: str
    address: str  # what the decode side binds; empty on a prefill instance
    token: str
    timeout_s: float
    staging_bytes: int

    @classmethod
    def from_config(cls, config) -> PDSettings:
        protocol = transfer_protocol(config.cache_transfer_protocol)
        address = ""
        if config.splitwise_role == "decode":
            address = transfer_address(protocol, config.kv_transfer_host, config.pd_comm_port)
        return cls(
            role=config.splitwise_role,
            address=address,
            token=os.environ.get(TOKEN_ENV, ""),
            timeout_s=_env_float(TIMEOUT_ENV, DEFAULT_TIMEOUT_S),
            staging_bytes=int(_env_float(STAGING_ENV, DEFAULT_STAGING_MB) * 2**20),
        )


def _env_float(name: str, default: float) -> float:
    value = os.environ.get(name)
    if not value:
        return default
    try:
        out = float(value)
    except ValueError:
        raise ConfigError(f"${name} must be a number, got {value!r}") from None
    if out <= 0:
        raise ConfigError(f"${name} must be positive, got {value!r}")
    return out
