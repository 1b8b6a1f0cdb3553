"""How tensor-parallel rank 0 reaches ranks on other nodes: one ZMQ ROUTER on TCP at
master_addr:(master_port + 1), beside the group's store at master_port.

Each remote worker connects a DEALER whose identity is its rank and says hello before it joins the
group; rank 0, once the group has every rank, waits for every hello, so its first message (WorkerInit)
can never be sent to a peer not yet connected. Frames are the same msgspec messages local workers get
over IPC (nothing is pickled). ROUTER_MANDATORY makes a send to a node that went away an error rather
than a silent drop. A remote worker sees rank 0 go away as its connection dropping (a socket monitor;
ZMQ heartbeats catch a machine that stops answering without closing the connection).
"""

from __future__ import annotations

import os

import zmq

from fdcli_engine.errors import ConfigError, FdError
from fdcli_engine.resolved_config import ResolvedConfig

GROUP_TIMEOUT_ENV = "FD_TP_GROUP_TIMEOUT"
DEFAULT_GROUP_TIMEOUT_S = 60.0  # every rank joins the group within this (model load comes after)
HELLO = b"hello"
HEARTBEAT_IVL_MS = 2000
HEARTBEAT_TIMEOUT_MS = 10000


class TensorParallelError(FdError):
    """A tensor-parallel rank died or could not start; the engine cannot go on."""


def group_timeout() -> float:
    """Seconds every rank has to join the group: FD_TP_GROUP_TIMEOUT, else 60."""
    raw = os.environ.get(GROUP_TIMEOUT_ENV, "").strip()
    if not raw:
        return DEFAULT_GROUP_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        value = 0.0
    if not value > 0:
        raise ConfigError(f"{GROUP_TIMEOUT_ENV}={raw!r}: give a positive number of seconds")
    return value


def step_address(config: ResolvedConfig) -> str:
    """Where rank 0's ROUTER listens: the master address, the port after the group's."""
    return f"tcp://{config.master_addr or '127.0.0.1'}:{int(config.master_port) + 1}"


def _identity(rank: int) -> bytes:
    return f"rank{rank}".encode()


def _heartbeat(sock: zmq.Socket) -> None:
    sock.setsockopt(zmq.HEARTBEAT_IVL, HEARTBEAT_IVL_MS)
    sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, HEARTBEAT_TIMEOUT_MS)


class RemoteRanks:
    """Rank 0's end: ranks local..world_size-1, on nodes 1..N-1."""

    def __init__(self, ctx: zmq.Context, config: ResolvedConfig, local: int):
        self.ranks = list(range(local, config.tensor_parallel_size))
        self.local = local
        self.address = step_address(config)
        self._sock = ctx.socket(zmq.ROUTER)
        self._sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        self._sock.setsockopt(zmq.SNDHWM, 0)
        self._sock.setsockopt(zmq.LINGER, 0)
        _heartbeat(self._sock)
        try:
            self._sock.bind(self.address)
        except zmq.ZMQError as exc:
            self._sock.close(0)
            raise ConfigError(
                f"tensor-parallel rank 0 cannot listen for other nodes at {self.address} ({exc}): "
                "pick another --master-port"
            ) from None

    def node_of(self, rank: int) -> int:
        return rank // self.local

    def await_hellos(self, timeout_s: float) -> None:
        """Block until every remote rank has connected (they say hello before joining the group, so
        once the group is complete this takes a round trip). ConfigError naming the absent ones."""
        missing = {_identity(r): r for r in self.ranks}
        poller = zmq.Poller()
        poller.register(self._sock, zmq.POLLIN)
        deadline_ms = timeout_s * 1000
        while missing and deadline_ms > 0:
            if poller.poll(100):
                ident, _ = self._sock.recv_multipart()
                missing.pop(ident, None)
            deadline_ms -= 100
        if missing:
            ranks = sorted(missing.values())
            nodes = sorted({self.node_of(r) for r in ranks})
            raise ConfigError(
                f"tensor-parallel ranks {', '.join(map(str, ranks))} (node {', '.join(map(str, nodes))}) "
                f"joined the group but never connected to {self.address} within {timeout_s:g} s"
            )

    def send(self, frame: bytes, flags: int = 0) -> None:
        for r in self.ranks:
            try:
                self._sock.send_multipart([_identity(r), frame], flags, copy=False)
            except zmq.ZMQError as exc:
                raise TensorParallelError(
                    f"tensor-parallel rank {r} (node {self.node_of(r)}) is unreachable from "
                    f"{self.address}: {exc}"
                ) from None

    def close(self) -> None:
        self._sock.close(0)


def connect_to_rank0(ctx: zmq.Context, address: str, rank: int) -> tuple[zmq.Socket, zmq.Socket]:
    """A remote worker's end: its DEALER, hello already queued, and a monitor that turns readable when
    the connection to rank 0 drops."""
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.IDENTITY, _identity(rank))
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RCVHWM, 0)
    _heartbeat(sock)
    monitor = sock.get_monitor_socket(zmq.EVENT_DISCONNECTED)
    sock.connect(address)
    sock.send(HELLO)
    return sock, monitor
