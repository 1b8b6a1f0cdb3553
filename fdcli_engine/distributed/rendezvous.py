"""How the ranks of one tensor-parallel group find each other: Paddle's TCPStore at master_addr:port.

Rank 0 hosts the store; every rank then marks itself present under its own key and waits until every
rank is present. The store is created with a world size of 1 so that its constructor never blocks on
the others (Paddle's own wait fails with a bare "elapsed > _timeout" naming nobody); the presence keys
are what lets the timeout error name the ranks, and their nodes, that never joined. A non-master rank
probes the address with a plain TCP connect first (Paddle's store client keeps retrying a refused
connection past any timeout it is given), then opens its client on a thread it leaves behind at the
deadline (that client waits forever on a listener that never answers: another service on the port).
"""

from __future__ import annotations

import os
import socket
import threading
import time
from dataclasses import dataclass

from fdcli_engine.errors import ConfigError

_JOINED = "fd_tp/joined"  # one counter per rank under it: 1 once that rank is in the store
_WORLD = "fd_tp/world_size"  # set by rank 0 as soon as its store listens
_POLL_S = 0.01


@dataclass
class Rendezvous:
    """The joined store and who this rank is; `store` stays open for the group's lifetime (rank 0's
    process serves it: closing it early would cut the other ranks' later reads)."""

    store: object  # paddle.base.core.TCPStore
    rank: int
    world_size: int
    address: str
    ranks_per_node: int

    def node_of(self, rank: int) -> int:
        return rank // self.ranks_per_node

    def describe(self, ranks: list[int]) -> str:
        """ "rank 1 (node 0)" / "ranks 2, 3 (node 1)": how errors name ranks."""
        nodes = sorted({self.node_of(r) for r in ranks})
        word = "rank" if len(ranks) == 1 else "ranks"
        node_word = "node" if len(nodes) == 1 else "nodes"
        return f"{word} {', '.join(map(str, ranks))} ({node_word} {', '.join(map(str, nodes))})"

    def wait_for(self, prefix: str, timeout_s: float, what: str, stated_s: float | None = None) -> None:
        """Wait until every rank has added 1 to `prefix/<rank>`; ConfigError naming the absent ones.
        `stated_s`: the timeout the error names, when `timeout_s` is what is left of it."""
        deadline = time.monotonic() + timeout_s
        timeout_s = timeout_s if stated_s is None else stated_s
        missing = None
        while True:
            try:
                missing = [r for r in range(self.world_size) if self.store.add(f"{prefix}/{r}", 0) == 0]
            except Exception:  # noqa: BLE001 - rank 0 ended (its own timeout came first): its store is gone
                self._fail(missing, what, timeout_s, "rank 0 gave up first")
            if not missing:
                return
            if time.monotonic() > deadline:
                self._fail(missing, what, timeout_s, "")
            time.sleep(_POLL_S)

    def _fail(self, missing: list[int] | None, what: str, timeout_s: float, why: str):
        me = f"this is rank {self.rank} of {self.world_size}"
        if not missing:  # rank 0 vanished before this rank learned who was absent
            raise ConfigError(f"tensor-parallel rank 0 (node 0) closed the group at {self.address} ({me})")
        raise ConfigError(
            f"tensor-parallel {self.describe(missing)} did not {what} at {self.address} within "
            f"{timeout_s:g} s ({why + '; ' if why else ''}{me})"
        )

    def mark(self, prefix: str) -> None:
        self.store.add(f"{prefix}/{self.rank}", 1)


def _wait_for_master(host: str, port: int, deadline: float, rank: int, world_size: int) -> None:
    while True:
        try:
            socket.create_connection((host, port), timeout=max(0.1, deadline - time.monotonic())).close()
            return
        except OSError as exc:
            if time.monotonic() > deadline:
                raise ConfigError(
                    f"tensor-parallel rank 0 (node 0) did not start the group at {host}:{port} within "
                    f"the timeout ({exc.strerror or exc}; this is rank {rank} of {world_size})"
                ) from None
            time.sleep(0.05)


def _check_port_free(port: int, address: str) -> None:
    """Paddle's store aborts the whole process (SIGABRT in libuv) when its port is taken: find out first,
    binding as its server does (all interfaces, SO_REUSEADDR so a closing group's TIME_WAIT passes)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("", port))
        except OSError as exc:
            raise ConfigError(
                f"tensor-parallel rank 0 cannot listen at {address}: port {port} is in use "
                f"({exc.strerror or exc}; another server or group holds it: pick another master port)"
            ) from None


def _open_client(core, host: str, port: int, deadline: float, store_timeout: int):
    """A non-master rank's store client, or None when the deadline passes first. Paddle's constructor
    releases the GIL and blocks without a limit when the listener never answers, so it runs on a daemon
    thread that is left behind on a timeout (the process then exits with the caller's error)."""
    box: dict[str, object] = {}

    def connect() -> None:
        try:
            box["store"] = core.TCPStore(host, port, False, 1, store_timeout)
        except Exception as exc:  # noqa: BLE001 - re-raised on the caller's thread
            box["error"] = exc

    thread = threading.Thread(target=connect, name="fd-tp-store-connect", daemon=True)
    thread.start()
    thread.join(max(0.0, deadline - time.monotonic()))
    if "error" in box:
        raise box["error"]  # type: ignore[misc]
    return box.get("store")


def _agree_on_shape(rv: Rendezvous) -> None:
    """Rank 0 publishes the world size; a rank launched with another one fails at once, not in a hang
    inside the first collective (ranks counted differently by two nodes' launch lines)."""
    if rv.rank == 0:
        rv.store.set(_WORLD, str(rv.world_size))
        return
    try:
        theirs = int(bytes(rv.store.get(_WORLD)))
    except Exception:  # noqa: BLE001 - rank 0 ended before publishing it
        raise ConfigError(f"tensor-parallel rank 0 (node 0) closed the group at {rv.address}") from None
    if theirs != rv.world_size:
        raise ConfigError(
            f"tensor-parallel rank {rv.rank} expects {rv.world_size} ranks, but rank 0 at {rv.address} "
            f"started a group of {theirs}"
        )


def set_paddle_rank_env(rank: int, world_size: int) -> None:
    """Paddle's process groups read the global rank from the launcher's variables even when created
    directly; set them where no launcher (paddle.distributed.launch) did."""
    os.environ.setdefault("PADDLE_TRAINER_ID", str(rank))
    os.environ.setdefault("PADDLE_TRAINERS_NUM", str(world_size))


def join(
    rank: int, world_size: int, master_addr: str, master_port: int, ranks_per_node: int, timeout_s: float
) -> Rendezvous:
    """Connect to (rank 0: start) the store and wait for every rank. ConfigError on a timeout."""
    from paddle.base import core  # noqa: PLC0415 - paddle loads only when a group is made

    set_paddle_rank_env(rank, world_size)
    address = f"{master_addr}:{master_port}"
    deadline = time.monotonic() + timeout_s
    if rank != 0:
        _wait_for_master(master_addr, master_port, deadline, rank, world_size)
    else:
        _check_port_free(int(master_port), address)
    store_timeout = max(1, int(timeout_s + 0.999))
    try:
        if rank == 0:
            store = core.TCPStore(master_addr, int(master_port), True, 1, store_timeout)
        else:
            store = _open_client(core, master_addr, int(master_port), deadline, store_timeout)
    except Exception as exc:  # noqa: BLE001 - Paddle raises bare RuntimeError/SystemError with C++ context
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ConfigError(
            f"tensor-parallel rank {rank} could not {'listen' if rank == 0 else 'connect'} at {address}: "
            f"{first}"
        ) from None
    if store is None:
        raise ConfigError(
            f"tensor-parallel rank 0 (node 0) did not answer at {address} within the timeout (something "
            f"listens there but is not a group's store: check --master-addr / --master-port; this is rank "
            f"{rank} of {world_size})"
        )
    rv = Rendezvous(store, rank, world_size, address, max(1, ranks_per_node))
    _agree_on_shape(rv)
    if store.add(f"{_JOINED}/{rank}", 1) != 1:
        raise ConfigError(f"tensor-parallel rank {rank} joined the group at {address} twice (two processes)")
    rv.wait_for(_JOINED, max(0.0, deadline - time.monotonic()), "join the group", timeout_s)
    return rv
