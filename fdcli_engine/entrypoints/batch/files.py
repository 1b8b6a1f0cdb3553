"""Input scanning, stdin spooling, --resume bookkeeping and the crash-safe output writer.

Memory invariant: no pass holds the input; the first pass keeps only custom_id → first line number
(plus the keys of records already written, on --resume), so a 1 GB file costs its id index only.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from fdcli_engine.entrypoints.batch.records import LineError, custom_id_of, load_json_line, record_key
from fdcli_engine.errors import FdError, InvalidRequestError

MAX_DUPLICATES_LISTED = 5


class BatchFileError(FdError):
    """The batch cannot run: unreadable input, unwritable output, or an input-wide problem."""


class DuplicateIdsError(InvalidRequestError):
    """Two lines share a custom_id; found before any model work."""


@dataclass
class ScanResult:
    num_lines: int = 0  # non-blank lines
    first_line: dict[str, int] = field(default_factory=dict)  # custom_id -> first line number


def iter_lines(path: Path) -> Iterator[tuple[int, bytes]]:
    """(1-based line number, raw line) for every non-blank line, read lazily in binary."""
    with open(path, "rb") as f:
        for line_no, raw in enumerate(f, start=1):
            if raw.strip():
                yield line_no, raw


def scan_input(path: Path) -> ScanResult:
    """First pass: count lines and refuse duplicate custom_ids, naming both line numbers."""
    result = ScanResult()
    duplicates: list[tuple[str, int, int]] = []
    for line_no, raw in iter_lines(path):
        result.num_lines += 1
        try:
            cid = custom_id_of(load_json_line(raw))
        except LineError:
            continue  # reported as an error record by the second pass
        if cid is None:
            continue
        first = result.first_line.setdefault(cid, line_no)
        if first != line_no:
            duplicates.append((cid, first, line_no))
    if duplicates:
        shown = "; ".join(f"{cid!r} on lines {a} and {b}" for cid, a, b in duplicates[:MAX_DUPLICATES_LISTED])
        more = len(duplicates) - MAX_DUPLICATES_LISTED
        tail = f" (and {more} more)" if more > 0 else ""
        raise DuplicateIdsError(f"duplicate custom_id: {shown}{tail}; every custom_id must be unique")
    return result


def spool_stdin(stream: IO[bytes] | None = None) -> Path:
    """Copy stdin to a temporary file (two passes need a seekable input); the caller deletes it."""
    src = stream if stream is not None else sys.stdin.buffer
    fd, name = tempfile.mkstemp(prefix="fd-batch-", suffix=".jsonl")
    with os.fdopen(fd, "wb") as out:
        shutil.copyfileobj(src, out, 1 << 20)
    return Path(name)


def partial_path(out: Path) -> Path:
    return out.with_name(out.name + ".partial")


def _truncate_torn_tail(path: Path) -> None:
    """Drop an incomplete last line (the process died mid-write), so appends start on a fresh line."""
    with open(path, "rb+") as f:
        size = f.seek(0, os.SEEK_END)
        if size == 0:
            return
        pos = size
        while pos > 0:
            step = min(pos, 1 << 16)
            f.seek(pos - step)
            chunk = f.read(step)
            nl = chunk.rfind(b"\n")
            if nl >= 0:
                keep = pos - step + nl + 1
                if keep != size:
                    f.truncate(keep)
                return
            pos -= step
        f.truncate(0)


def _read_keys(path: Path) -> Iterator[tuple[tuple[str, Any], bool, bytes]]:
    """(key, succeeded, raw line) of every complete record in an output file."""
    with open(path, "rb") as f:
        for raw in f:
            if not raw.endswith(b"\n"):
                continue  # torn line
            try:
                record = json.loads(raw)
            except (json.JSONDecodeError, UnicodeDecodeError, RecursionError):
                continue
            key = record_key(record)
            if key is not None:
                yield key, record.get("error") is None, raw


def prepare_output(out: Path, resume: bool) -> tuple[dict, int]:
    """Set up OUT.partial for appending. Returns ({key already done: succeeded?}, records carried over).

    Without --resume the partial file starts empty and OUT is left alone until the run succeeds.
    With --resume the partial's complete lines are kept and the records of a previous OUT that the
    partial lacks are copied in, so every key appears once and earlier results stay byte-identical.
    """
    part = partial_path(out)
    try:
        if not resume or not part.exists():
            part.write_bytes(b"")
        else:
            _truncate_torn_tail(part)
        done: dict = {}
        for key, ok, _ in _read_keys(part):
            done[key] = ok
        carried = len(done)
        if resume and out.exists():
            with open(part, "ab") as f:
                for key, ok, raw in _read_keys(out):
                    if key not in done:
                        done[key] = ok
                        f.write(raw)
                        carried += 1
    except OSError as e:
        raise BatchFileError(f"cannot prepare the output {str(part)!r}: {e.strerror or e}") from None
    return done, carried


class OutputWriter:
    """Appends records to OUT.partial (flushed after every write burst); `commit` renames it to OUT.

    `-o -` writes to stdout instead: no partial file, no rename, no resume.
    """

    def __init__(self, out: Path | None):
        self.out = out
        if out is None:
            self._f = sys.stdout
        else:
            self._f = open(partial_path(out), "a", encoding="utf-8")  # noqa: SIM115 - closed in close()

    def write(self, text: str) -> None:
        self._f.write(text)

    def flush(self) -> None:
        self._f.flush()

    def commit(self) -> None:
        """Make OUT complete and durable: fsync the partial file, then rename it over OUT."""
        self.flush()
        if self.out is None:
            return
        os.fsync(self._f.fileno())
        self._f.close()
        os.replace(partial_path(self.out), self.out)

    def close(self) -> None:
        if self.out is not None and not self._f.closed:
            self._f.flush()
            self._f.close()
