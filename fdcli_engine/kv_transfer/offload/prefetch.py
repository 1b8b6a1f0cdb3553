"""Reads of the file tier ahead of a request, on a reader thread, so the engine never waits for the disk.

When a waiting request's next blocks are only in files, the connector starts a job for them and answers
"not known yet" (None) until the job is done; the request keeps its place and the others run. The
reader reads and checks the blocks in order (FileTier.get: header, CRC) into the job's staging and
stops at the first it cannot read, so a job holds a leading run of blocks; a damaged or missing file
ends the run there and the rest is recomputed. A job's blocks go into the pool when the request is
admitted (take), and the job is dropped then, or when the request finishes or is aborted first (drop).

Staging is bounded: a job reserves its blocks when it starts, and jobs never reserve more than
`max_blocks` in all (a job that finds less room reads fewer blocks; with none, no job starts and the
request computes those blocks).
A finished job keeps only the room of the blocks it staged, and each block loaded frees its room.
A dropped job is cancelled: the reader stops adding to it and releases nothing twice, so an abort
leaves staging empty at once (`num_jobs`, `num_reserved`).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

import numpy as np

from fdcli_engine.kv_transfer.offload.worker import QueueWorker

MAX_STAGED_BYTES = 256 << 20  # the staging bound: blocks read ahead and not yet loaded, all requests


@dataclass
class _Job:
    hashes: list[bytes]
    blocks: dict[bytes, list[np.ndarray]] = field(default_factory=dict)
    reserved: int = 0  # staging held: blocks staged, plus blocks still to read while not done
    done: bool = False
    cancelled: bool = False


class Prefetcher:
    def __init__(self, files, block_nbytes: int, max_bytes: int = MAX_STAGED_BYTES):
        self.files = files
        self.max_blocks = max(1, max_bytes // max(1, block_nbytes))
        self.num_reserved = 0
        self._lock = threading.Lock()
        self._jobs: dict[str, _Job] = {}
        self._reader = QueueWorker(self._run, "fd-kv-offload-reader")

    @property
    def num_jobs(self) -> int:
        with self._lock:
            return len(self._jobs)

    def poll(self, req_id: str) -> tuple[str, dict[bytes, list[np.ndarray]]]:
        """("none", {}) without a job, ("reading", {}) while one runs, ("done", its staged blocks)."""
        with self._lock:
            job = self._jobs.get(req_id)
            if job is None:
                return "none", {}
            return ("done", job.blocks) if job.done else ("reading", {})

    def start(self, req_id: str, hashes: list[bytes]) -> bool:
        """Read `hashes` (as many as staging has room for) for request `req_id` (which has no job);
        False, and no job, when staging is full."""
        with self._lock:
            job = _Job(hashes[: max(0, self.max_blocks - self.num_reserved)])
            if not job.hashes:
                return False
            job.reserved = len(job.hashes)
            self.num_reserved += job.reserved
            self._jobs[req_id] = job
        self._reader.put(job)
        return True

    def take(self, req_id: str, block_hash: bytes) -> list[np.ndarray] | None:
        with self._lock:
            job = self._jobs.get(req_id)
            stored = job.blocks.pop(block_hash, None) if job is not None and job.done else None
            if stored is not None:
                job.reserved -= 1
                self.num_reserved -= 1
            return stored

    def drop(self, req_id: str) -> None:
        """Forget the request's job and its staged blocks; a read in flight is abandoned."""
        with self._lock:
            job = self._jobs.pop(req_id, None)
            if job is None:
                return
            job.cancelled = True
            job.blocks = {}
            self.num_reserved -= job.reserved
            job.reserved = 0

    def _run(self, job: _Job) -> None:
        try:
            self._read(job)
        finally:
            with self._lock:
                job.done = True
                if not job.cancelled:  # blocks not read free their room now
                    self.num_reserved -= job.reserved - len(job.blocks)
                    job.reserved = len(job.blocks)

    def _read(self, job: _Job) -> None:
        for h in job.hashes:
            if job.cancelled:
                return
            try:
                stored = self.files.get(h)
            except Exception:  # noqa: BLE001 - any failure to read is a miss: the block is recomputed
                stored = None
            if stored is None:
                return
            with self._lock:
                if job.cancelled:
                    return
                job.blocks[h] = stored

    def flush(self) -> None:
        """Wait until every job started is done (tests)."""
        self._reader.flush()

    def close(self) -> None:
        self._reader.close()
        with self._lock:
            for job in self._jobs.values():
                job.cancelled = True
            self._jobs.clear()
            self.num_reserved = 0
