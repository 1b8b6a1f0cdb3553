"""`ShmGroup`: the collectives of ranks on one host, through a shared-memory segment (C++ in
fd_kernels/csrc/shm_allreduce.cc, which describes the protocol; called through ctypes).

Set-up: the ranks meet in the TCPStore (rendezvous.py); rank 0 creates the segment under a name derived
from the uid and master_addr:port (two groups on one host cannot share a port, so never a name),
removing a stale one a killed group left behind, and publishes a random nonce the others check when they
attach. Once every rank has attached, rank 0 unlinks the name: the mapping lives on in the processes, and
nothing is left in /dev/shm even if every rank is then SIGKILLed.
"""

from __future__ import annotations

import atexit
import ctypes
import math
import os
import re
import secrets
from typing import TYPE_CHECKING

from fdcli_engine.distributed.common import CollectiveError, concat_parts, dense, gather_axis, rank_order_sum
from fdcli_engine.distributed.rendezvous import join
from fdcli_engine.errors import ConfigError

if TYPE_CHECKING:
    import paddle

SLOT_BYTES = 4 << 20  # per rank; a larger tensor goes through in chunks of this size
_SEGMENT_KEY = "fd_tp/shm/segment"  # "<nonce> <slot bytes>", set by rank 0 once the segment exists
_ATTACHED = "fd_tp/shm/attached"
_lib = None


def _library():
    """The kernel library's C entry points. A cached build is opened directly: registering its Paddle
    ops (what `load()` does, about a second) is not needed for these; otherwise it is built first."""
    global _lib
    if _lib is None:
        import paddle  # noqa: F401, PLC0415 - the library links against Paddle's, which this loads
        from fd_kernels.build import MODULE_NAME, build_dir, library_path  # noqa: PLC0415

        cached = build_dir() / MODULE_NAME / f"{MODULE_NAME}.so"
        try:
            lib = ctypes.CDLL(str(cached)) if cached.exists() else None
        except OSError:  # a half-written or stale cache entry: load() rebuilds it
            lib = None
        _lib = _bind(lib or ctypes.CDLL(library_path()))
    return _lib


def _bind(lib):
    p, i32, i64, u64, cp = ctypes.c_void_p, ctypes.c_int32, ctypes.c_int64, ctypes.c_uint64, ctypes.c_char_p
    sigs = {
        "fd_shm_create": ([cp, i32, i64, u64, cp, i64], p),
        "fd_shm_attach": ([cp, i32, i32, u64, cp, i64], p),
        "fd_shm_close": ([p], None),
        "fd_shm_unlink": ([cp], i32),
        "fd_shm_all_reduce_f32": ([p, p, p, i64, ctypes.c_double, p], i32),
        "fd_shm_all_gather": ([p, p, p, i64, ctypes.c_double, p], i32),
        "fd_shm_barrier": ([p, ctypes.c_double, p], i32),
        "fd_shm_max_ranks": ([], i32),
    }
    for name, (args, res) in sigs.items():
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = args, res
    return lib


def segment_name(master_addr: str, master_port: int) -> str:
    """The group's /dev/shm name: fixed for an address, so the next start finds a stale one."""
    return f"/fd_tp_{os.getuid()}_{re.sub(r'[^A-Za-z0-9.-]', '_', master_addr)}_{int(master_port)}"


class ShmGroup:
    """A `ProcessGroup` for ranks on one host. Same lockstep contract as `GlooGroup`. all_reduce writes
    the sum into `x` when x is a contiguous float32 tensor (the protocol allows it) and returns it."""

    def __init__(
        self,
        rank: int,
        world_size: int,
        master_addr: str,
        master_port: int,
        timeout_s: float = 300.0,
        slot_bytes: int = SLOT_BYTES,
    ):
        lib = _library()
        if world_size > lib.fd_shm_max_ranks():
            raise ConfigError(f"shared-memory collectives take at most {lib.fd_shm_max_ranks()} ranks")
        self.rank, self.world_size, self.timeout_s = rank, world_size, float(timeout_s)
        self._name = segment_name(master_addr, master_port)
        self._rv = join(rank, world_size, master_addr, master_port, world_size, timeout_s)
        self._who = ctypes.c_int32(-1)
        self._who_ptr = ctypes.addressof(self._who)
        self._broken: str | None = None
        self._linked = rank == 0  # rank 0 unlinks the name once, as soon as nobody needs it any more
        self._handle = self._create(lib, slot_bytes) if rank == 0 else self._attach(lib)
        atexit.register(self.close)
        try:
            self._rv.mark(_ATTACHED)
            self._rv.wait_for(_ATTACHED, timeout_s, "attach to the shared-memory segment")
        except BaseException:
            self.close()
            raise
        self._unlink()

    def _unlink(self) -> None:
        if self._linked:
            self._linked = False
            _lib.fd_shm_unlink(self._name.encode())

    def _create(self, lib, slot_bytes: int) -> int:
        nonce = secrets.randbits(63)
        err = ctypes.create_string_buffer(512)
        handle = lib.fd_shm_create(self._name.encode(), self.world_size, slot_bytes, nonce, err, len(err))
        if not handle:
            raise ConfigError(f"tensor-parallel rank 0: {err.value.decode(errors='replace')}")
        self._rv.store.set(_SEGMENT_KEY, f"{nonce} {slot_bytes}")
        return handle

    def _attach(self, lib) -> int:
        try:
            nonce = int(bytes(self._rv.store.get(_SEGMENT_KEY)).split()[0])
        except Exception:  # noqa: BLE001 - the store's wait timed out, or rank 0 ended
            raise ConfigError(
                f"tensor-parallel rank 0 (node 0) did not create the shared-memory segment {self._name} "
                f"for the group at {self._rv.address} (this is rank {self.rank} of {self.world_size})"
            ) from None
        err = ctypes.create_string_buffer(512)
        handle = lib.fd_shm_attach(self._name.encode(), self.rank, self.world_size, nonce, err, len(err))
        if not handle:
            raise ConfigError(f"tensor-parallel rank {self.rank}: {err.value.decode(errors='replace')}")
        return handle

    def _check(self, status: int, op: str) -> None:
        if status == 0:
            return
        who = self._who.value
        why = "exited" if status == 2 else f"did not arrive within {self.timeout_s:g} s"
        self._broken = (
            f"tensor-parallel {op}: rank {who} {why} (shared-memory group {self._name}, this is rank "
            f"{self.rank} of {self.world_size})"
        )
        raise CollectiveError(self._broken)

    def _usable(self) -> int:
        if self._broken:
            raise CollectiveError(self._broken)
        if not self._handle:
            raise CollectiveError(f"tensor-parallel group {self._name} is closed")
        return self._handle

    def all_reduce(self, x: paddle.Tensor) -> paddle.Tensor:
        import paddle  # noqa: PLC0415

        handle = self._usable()
        if x.dtype != paddle.float32:  # not a hot path: gather, then the same rank-order sum
            return rank_order_sum(self._gather(x))
        x = dense(x)
        n = math.prod(x.shape)
        if n:
            ptr = x.data_ptr()
            self._check(
                _lib.fd_shm_all_reduce_f32(handle, ptr, ptr, n, self.timeout_s, self._who_ptr), "all_reduce"
            )
        return x

    def _gather(self, x: paddle.Tensor) -> paddle.Tensor:
        """[world_size, *x.shape]: every rank's x, in rank order."""
        import paddle  # noqa: PLC0415

        handle = self._usable()
        x = dense(x)
        out = paddle.empty([self.world_size, *x.shape], dtype=x.dtype)
        nbytes = math.prod(x.shape) * x.element_size()
        if nbytes:
            status = _lib.fd_shm_all_gather(
                handle, x.data_ptr(), out.data_ptr(), nbytes, self.timeout_s, self._who_ptr
            )
            self._check(status, "all_gather")
        return out

    def all_gather(self, x: paddle.Tensor, axis: int = -1) -> paddle.Tensor:
        axis = gather_axis(axis, len(x.shape))  # before the collective: a bad axis fails every rank alike
        return concat_parts(self._gather(x), axis)

    def barrier(self) -> None:
        self._check(_lib.fd_shm_barrier(self._usable(), self.timeout_s, self._who_ptr), "barrier")

    def close(self) -> None:
        """Unmap the segment (and, on rank 0, unlink its name if still there). Idempotent."""
        handle, self._handle = getattr(self, "_handle", None), None
        if handle:
            _lib.fd_shm_close(handle)
            self._unlink()  # before the store goes: while rank 0 holds the port, the name is this group's
        self._rv = None
