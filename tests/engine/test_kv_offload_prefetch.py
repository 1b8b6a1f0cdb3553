"""Reading the file tier ahead of a request (kv_transfer/offload/prefetch.py): the request waits while its
blocks are read on the reader thread, the outputs are those of an engine without a tier (greedy tokens
and logprobs identical), a file damaged while it is read ahead is recomputed, and an abort while
reading leaves nothing staged and the pool as it was. Staging stays within its bound."""

from __future__ import annotations

import threading

import numpy as np
from test_kv_connector import core_request, outputs
from test_kv_offload import PARAMS, PROMPTS, engine, passes

from fdcli_engine.kv_transfer.offload.prefetch import Prefetcher

WAIT_S = 30  # every wait on the reader is bounded


def _written(folder, tmp_path):
    first = engine(folder, num_kv_blocks=64, kv_offload_dir=str(tmp_path))
    want = passes(first, n=1)[0]
    first.engine.shutdown()  # writes what is queued
    return want


def test_restart_reads_ahead_then_answers_identically(tiny_model_dir, tmp_path):
    folder = tiny_model_dir("LlamaForCausalLM")
    want = _written(folder, tmp_path)
    llm = engine(folder, num_kv_blocks=64, kv_offload_dir=str(tmp_path))
    core, conn = llm.engine, llm.engine.kv_connector
    core.add_request(core_request("a", PROMPTS[0]))
    assert core.step() == []  # the first look starts the read and the request waits
    assert core.scheduler.num_deferred == 1 and conn.prefetch.num_jobs == 1
    conn.prefetch.flush()
    while core.has_unfinished_requests():
        core.step()
    assert conn.prefetch.num_jobs == 0 and conn.prefetch.num_reserved == 0  # loaded and released
    assert outputs(llm.generate(PROMPTS, PARAMS)) == want
    s = llm.get_stats()
    assert s["kv_offload_hit_tokens"] > 0 and s["kv_offload_bytes:DISK_to_KV"] > 0
    llm.engine.shutdown()


def test_a_file_damaged_while_read_ahead_is_recomputed(tiny_model_dir, tmp_path):
    folder = tiny_model_dir("LlamaForCausalLM")
    want = _written(folder, tmp_path)
    llm = engine(folder, num_kv_blocks=64, kv_offload_dir=str(tmp_path))
    tier = llm.engine.kv_connector.files
    read, reads = tier.get, []

    def damaging_get(block_hash):
        reads.append(block_hash)
        if len(reads) == 2:  # the second block of the first job: damaged just before it is read
            path = tier._path(block_hash)
            data = bytearray(path.read_bytes())
            data[-1] ^= 0xFF
            path.write_bytes(bytes(data))
        return read(block_hash)

    tier.get = damaging_get
    assert outputs(llm.generate(PROMPTS, PARAMS)) == want
    s = llm.get_stats()
    assert tier.num_corrupt == 1 and len(reads) >= 2
    assert s["kv_offload_hit_tokens"] > 0  # the blocks before the damaged one still came from files
    llm.engine.shutdown()


def test_abort_while_reading_ahead_leaks_nothing(tiny_model_dir, tmp_path):
    folder = tiny_model_dir("LlamaForCausalLM")
    _written(folder, tmp_path)
    llm = engine(folder, num_kv_blocks=64, kv_offload_dir=str(tmp_path))
    core, conn = llm.engine, llm.engine.kv_connector
    free0 = core.scheduler.kv.num_free_blocks
    gate, reading = threading.Event(), threading.Event()
    read = conn.files.get

    def held_get(block_hash):
        reading.set()
        assert gate.wait(WAIT_S)
        return read(block_hash)

    conn.files.get = held_get
    core.add_request(core_request("a", PROMPTS[0]))
    assert core.step() == [] and reading.wait(WAIT_S)  # the read is in flight
    assert conn.prefetch.num_jobs == 1 and conn.prefetch.num_reserved > 0
    outs = core.abort_requests(["a"])
    assert [o.finish_reason for o in outs] == ["abort"]
    assert conn.prefetch.num_jobs == 0 and conn.prefetch.num_reserved == 0  # staging dropped at once
    assert core.scheduler.kv.num_free_blocks == free0 and not core.has_unfinished_requests()
    gate.set()
    conn.prefetch.flush()  # the abandoned read ends without staging anything
    assert conn.prefetch.num_jobs == 0 and conn.prefetch.num_reserved == 0
    assert core.scheduler.kv.num_free_blocks == free0
    llm.engine.shutdown()


class _Files:
    def __init__(self, missing=()):
        self.missing = set(missing)

    def get(self, h):
        return None if h in self.missing else [np.frombuffer(h, np.uint8)]


def test_staging_is_bounded_and_a_run_stops_at_a_miss():
    pf = Prefetcher(_Files(missing={b"c"}), block_nbytes=100, max_bytes=500)  # room for 5 blocks
    assert pf.start("r1", [b"a", b"b", b"c", b"d"])
    assert pf.start("r2", [b"e", b"f", b"g"])  # one block of room left
    assert not pf.start("r3", [b"h"])  # none left: no job, the request computes its blocks
    pf.flush()
    assert pf.num_reserved == 3  # a finished job keeps the room of what it staged
    state, blocks = pf.poll("r1")
    assert state == "done" and list(blocks) == [b"a", b"b"]  # the run ends at the missing block
    assert list(pf.poll("r2")[1]) == [b"e"] and pf.poll("r3") == ("none", {})
    assert pf.take("r1", b"a") is not None and pf.take("r1", b"a") is None
    assert pf.num_reserved == 2
    for rid in ("r1", "r2", "r3"):
        pf.drop(rid)  # r3 has no job: nothing happens
    assert pf.num_reserved == 0 and pf.num_jobs == 0 and pf.poll("r1") == ("none", {})
    pf.close()
