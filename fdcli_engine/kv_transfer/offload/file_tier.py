"""The file tier (`--kv-offload-dir DIR`, bounded by `--kv-offload-dir-gb`): one file per block under
DIR/<model identity>/, so blocks outlive the server and come back after a restart with the same model.

A file is a header (magic, format version, model identity, block hash, payload length, CRC-32 of the
payload) and the encoded block. It is written to a temporary name and renamed, so a reader sees a whole
file or none; a file whose header or CRC does not match is deleted and counts as a miss (the block is
recomputed), never loaded. Writes run on one background thread so the engine never waits for the disk;
a block queued but not yet written is served from the queue. The bound counts this identity's files:
before each write the least recently used files are deleted until the new one fits, so the files never
exceed it. Only one engine may use a directory at a time (its index is in that engine's memory).
"""

from __future__ import annotations

import logging
import os
import struct
import threading
import zlib
from collections import OrderedDict
from pathlib import Path

import numpy as np

from fdcli_engine.kv_transfer.offload.worker import QueueWorker

logger = logging.getLogger(__name__)

MAGIC = b"FDKV"
VERSION = 2  # 2: an int8 block's codes and scales stored per group of parts (codec.py)
HEADER = struct.Struct("<4sI32s32sQI")  # magic, version, identity, block hash, payload bytes, crc32
MAX_PENDING = 256  # blocks queued for writing; more are dropped (the tier is a cache)
SUFFIX = ".kv"


class FileTier:
    def __init__(self, root: str | os.PathLike, capacity_bytes: int, identity: bytes, codec):
        self.capacity = int(capacity_bytes)
        self.identity = identity
        self.codec = codec
        self.dir = Path(root) / identity.hex()[:32]
        self.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        self._lock = threading.Lock()
        self._index: OrderedDict[bytes, int] = OrderedDict()  # hash -> file bytes, LRU first
        self.nbytes = 0
        self.num_corrupt = 0
        self.num_dropped = 0
        self._scan()
        self._pending: dict[bytes, list[np.ndarray]] = {}
        self._writer = QueueWorker(self._write, "fd-kv-offload-writer")

    def _path(self, block_hash: bytes) -> Path:
        return self.dir / (block_hash.hex() + SUFFIX)

    def _scan(self) -> None:
        """Index the files a previous run left, oldest use first; drop unfinished temporaries."""
        found = []
        for entry in os.scandir(self.dir):
            if entry.name.startswith(".tmp-"):
                _unlink(entry.path)
            elif entry.name.endswith(SUFFIX) and entry.is_file():
                try:
                    h = bytes.fromhex(entry.name[: -len(SUFFIX)])
                except ValueError:
                    continue
                st = entry.stat()
                found.append((st.st_mtime_ns, h, st.st_size))
        for _, h, size in sorted(found):
            self._index[h] = size
            self.nbytes += size
        with self._lock:
            self._make_room(0)

    def __len__(self) -> int:
        with self._lock:
            return len(self._index) + len(self._pending)

    def __contains__(self, block_hash: bytes) -> bool:
        with self._lock:
            return block_hash in self._index or block_hash in self._pending

    def get(self, block_hash: bytes) -> list[np.ndarray] | None:
        with self._lock:
            stored = self._pending.get(block_hash)
            if stored is not None:
                return stored
            if block_hash not in self._index:
                return None
            self._index.move_to_end(block_hash)
        path = self._path(block_hash)
        try:
            data = path.read_bytes()
        except OSError:
            data = b""
        stored = self._parse(block_hash, data)
        if stored is None:
            self.num_corrupt += 1
            logger.warning("KV offload file %s is damaged or foreign: ignored and deleted", path.name)
            with self._lock:
                size = self._index.pop(block_hash, None)
                if size is not None:
                    self.nbytes -= size
            _unlink(path)
            return None
        try:
            os.utime(path)  # the LRU order survives a restart
        except OSError:
            pass
        return stored

    def _parse(self, block_hash: bytes, data: bytes) -> list[np.ndarray] | None:
        if len(data) < HEADER.size:
            return None
        magic, version, identity, h, length, crc = HEADER.unpack_from(data)
        payload = data[HEADER.size :]
        if (magic, version, identity, h) != (MAGIC, VERSION, self.identity, block_hash):
            return None
        if length != len(payload) or zlib.crc32(payload) != crc:
            return None
        return self.codec.from_bytes(payload)

    def put(self, block_hash: bytes, stored: list[np.ndarray]) -> None:
        """Queue a block for writing (nothing if it is there or queued already)."""
        with self._lock:
            if block_hash in self._index or block_hash in self._pending:
                return
            if len(self._pending) >= MAX_PENDING:
                self.num_dropped += 1
                return
            self._pending[block_hash] = stored
        self._writer.put(block_hash)

    def _make_room(self, size: int) -> bool:
        """Delete least recently used files until `size` more bytes fit (lock held)."""
        if size > self.capacity:
            return False
        while self.nbytes + size > self.capacity and self._index:
            h, old = self._index.popitem(last=False)
            self.nbytes -= old
            _unlink(self._path(h))
        return True

    def _write(self, block_hash: bytes) -> None:
        with self._lock:
            stored = self._pending.get(block_hash)
        payload = self.codec.to_bytes(stored)
        data = HEADER.pack(MAGIC, VERSION, self.identity, block_hash, len(payload), zlib.crc32(payload))
        size = len(data) + len(payload)
        with self._lock:
            ok = self._make_room(size)
            if ok:
                self.nbytes += size  # reserved before the write: the files never pass the bound
        tmp = self.dir / f".tmp-{os.getpid()}-{block_hash.hex()[:16]}"
        try:
            if ok:
                with open(tmp, "wb") as f:
                    f.write(data)
                    f.write(payload)
                os.replace(tmp, self._path(block_hash))
        except OSError as e:
            logger.warning("KV offload: could not write %s: %s", tmp, e)
            _unlink(tmp)
            ok = False
            with self._lock:
                self.nbytes -= size
        with self._lock:
            self._pending.pop(block_hash, None)
            if ok:
                self._index[block_hash] = size

    def flush(self) -> None:
        """Wait until every queued block is written."""
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


def _unlink(path) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass
