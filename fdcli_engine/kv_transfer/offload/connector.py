"""The offload connector: a second and a third KV tier behind the pool, keyed by block hash.

What goes where:
- a cached block the pool evicts (on_evict) goes to the memory tier (`--swap-space`), or straight to the
  file tier when there is no memory tier;
- a preempted request's computed full blocks go there too (request_finished), so its resume loads them;
- a finished request's full blocks are queued for the file tier (`--kv-offload-dir`), so the prefix
  survives a restart;
- a block the memory tier evicts spills to the file tier.
On admission the request's blocks after the pool's hit are looked up in order, memory first; blocks
only in files are first read ahead on a reader thread (prefetch.py: the request waits, the others run);
the run of consecutive blocks found is offered and loaded. A block that cannot be read ends the run
there; the scheduler computes the rest.
"""

from __future__ import annotations

import time

from fdcli_engine.kv_transfer.base import KVConnector
from fdcli_engine.kv_transfer.offload.codec import BlockCodec
from fdcli_engine.kv_transfer.offload.file_tier import FileTier
from fdcli_engine.kv_transfer.offload.identity import model_identity
from fdcli_engine.kv_transfer.offload.memory_tier import MemoryTier
from fdcli_engine.kv_transfer.offload.prefetch import Prefetcher
from fdcli_engine.request import RequestStatus

# vLLM's transfer_type values name the two media of a copy; here the pool is "KV", the memory tier
# "CPU" and the file tier "DISK".
TRANSFER_TYPES = ("KV_to_CPU", "CPU_to_KV", "KV_to_DISK", "DISK_to_KV", "CPU_to_DISK")


class OffloadConnector(KVConnector):
    def __init__(
        self,
        config,
        swap_space_bytes: int = 0,
        compression: str | None = None,
        file_dir: str | None = None,
        file_bytes: int = 0,
    ):
        self.config = config
        self.swap_space_bytes = swap_space_bytes
        self.compression = compression
        self.file_dir = file_dir
        self.file_bytes = file_bytes
        self.memory: MemoryTier | None = None
        self.files: FileTier | None = None
        self.prefetch: Prefetcher | None = None
        self.hit_tokens = 0
        self.bytes = dict.fromkeys(TRANSFER_TYPES, 0)
        self.seconds = dict.fromkeys(TRANSFER_TYPES, 0.0)

    def bind(self, views) -> None:
        super().bind(views)
        self.block_size = views.block_size
        self.codec = BlockCodec(views, self.compression)
        if self.swap_space_bytes:
            self.memory = MemoryTier(self.swap_space_bytes)
        if self.file_dir:
            identity = model_identity(self.config, views, self.compression)
            self.files = FileTier(self.file_dir, self.file_bytes, identity, self.codec)
            self.prefetch = Prefetcher(self.files, self.codec.nbytes)

    # -- admission ---------------------------------------------------------------------------------
    def get_num_new_matched_tokens(self, request, num_computed_tokens: int) -> int | None:
        """The run of blocks after the pool's hit found in memory or read ahead from files. Blocks only
        in files are read on the reader thread first: None until that read is done."""
        first = num_computed_tokens // self.block_size
        hashes = request.update_block_hashes(self.block_size)[first:]
        state, staged = self.prefetch.poll(request.req_id) if self.prefetch is not None else ("none", {})
        if state == "reading":
            return None
        n = 0
        while n < len(hashes) and (
            (self.memory is not None and hashes[n] in self.memory) or hashes[n] in staged
        ):
            n += 1
        if state == "none" and self.prefetch is not None:
            room = (request.num_tokens - 1) // self.block_size - first  # the scheduler takes no more
            rest = []
            for h in hashes[n:room]:
                if h not in self.files:
                    break
                rest.append(h)
            if rest and self.prefetch.start(request.req_id, rest):
                return None
        return n * self.block_size

    def load(self, request, block_hashes: list[bytes], block_ids: list[int]) -> int:
        try:
            for i, (h, bid) in enumerate(zip(block_hashes, block_ids)):
                t0 = time.perf_counter()
                stored = self.memory.get(h) if self.memory is not None else None
                kind = "CPU_to_KV"
                if stored is None and self.prefetch is not None:
                    stored, kind = self.prefetch.take(request.req_id, h), "DISK_to_KV"
                if stored is None and self.files is not None:
                    # Moved from memory to files since the lookup (an eviction while allocating): the
                    # write queue or the file still has it.
                    stored, kind = self.files.get(h), "DISK_to_KV"
                if stored is None:
                    return i
                self.codec.decode_into(stored, self.views, bid)
                self._count(kind, t0)
                self.hit_tokens += self.block_size
            return len(block_hashes)
        finally:
            if self.prefetch is not None:
                self.prefetch.drop(request.req_id)

    # -- saving ------------------------------------------------------------------------------------
    def on_evict(self, block_hash: bytes, block_id: int) -> None:
        self._save(block_hash, block_id)

    def request_finished(self, request) -> None:
        if self.prefetch is not None:
            self.prefetch.drop(request.req_id)  # an abort while reading ahead leaves nothing staged
        n = min(request.num_computed_tokens // self.block_size, len(request.block_ids))
        if not n:
            return
        hashes = request.update_block_hashes(self.block_size)
        if request.status is RequestStatus.PREEMPTED:
            for h, bid in zip(hashes[:n], request.block_ids[:n]):
                self._save(h, bid)
        elif self.files is not None:
            for h, bid in zip(hashes[:n], request.block_ids[:n]):
                if h not in self.files:
                    self._to_files(h, bid)

    def _save(self, h: bytes, bid: int) -> None:
        if self.memory is None:
            if h not in self.files:
                self._to_files(h, bid)
            return
        t0 = time.perf_counter()
        stored = self.codec.encode_block(self.views, bid)
        evicted = self.memory.put(h, stored)
        self._count("KV_to_CPU", t0)
        if self.files is not None:
            for old_h, old in evicted:
                t0 = time.perf_counter()
                self.files.put(old_h, old)
                self._count("CPU_to_DISK", t0)

    def _to_files(self, h: bytes, bid: int) -> None:
        t0 = time.perf_counter()
        self.files.put(h, self.codec.encode_block(self.views, bid))
        self._count("KV_to_DISK", t0)

    def _count(self, kind: str, t0: float) -> None:
        self.bytes[kind] += self.codec.nbytes
        self.seconds[kind] += time.perf_counter() - t0

    # -- reporting ---------------------------------------------------------------------------------
    def stats(self) -> dict:
        out = {
            "prefix_cpu_cache_token_num": len(self.memory) * self.block_size if self.memory else 0,
            "kv_offload_cpu_cache_bytes": self.memory.nbytes if self.memory else 0,
            "kv_offload_disk_cache_token_num": len(self.files) * self.block_size if self.files else 0,
            "kv_offload_disk_cache_bytes": self.files.nbytes if self.files else 0,
            "kv_offload_hit_tokens": self.hit_tokens,
        }
        for kind in TRANSFER_TYPES:
            out[f"kv_offload_bytes:{kind}"] = self.bytes[kind]
            out[f"kv_offload_seconds:{kind}"] = self.seconds[kind]
        return out

    def flush(self) -> None:
        """Wait for queued file writes (tests, and before a planned restart)."""
        if self.files is not None:
            self.files.flush()

    def close(self) -> None:
        if self.prefetch is not None:
            self.prefetch.close()
        if self.files is not None:
            self.files.close()
