"""The prefill → decode KV transfer (kv_transfer/pd/) between two in-process engines on loopback.

Oracle: a mixed engine of the same checkpoint; greedy tokens must be identical whether the decode
engine loads the prefill engine's blocks, or refuses them and recomputes (a transfer cut halfway, a
wrong token, another prompt's blocks, a transfer over the staging bound). After every case both
pools are back to their free-block baseline and nothing stays staged.
"""

from __future__ import annotations

import dataclasses
import itertools
import time

import pytest
import zmq
from test_engine_e2e import prompts_of

from fdcli_engine import LLM, SamplingParams
from fdcli_engine.config import EngineConfig
from fdcli_engine.errors import ConfigError
from fdcli_engine.kv_transfer.pd.messages import ENCODER, part_specs
from fdcli_engine.kv_transfer.pd.sender import Outgoing, Sender

BS = 4
BLOCKS = 64
ROUTER = "127.0.0.1:9"  # never contacted by an in-process engine
_ids = itertools.count()


def params(**kv):
    return SamplingParams(temperature=0, max_tokens=6, ignore_eos=True, kv_transfer_params=kv or None)


def engine(folder, role="mixed", **kw):
    opts = dict(max_model_len=128, block_size=BS, num_kv_blocks=BLOCKS, threads=1, **kw)
    if role != "mixed":
        opts.update(splitwise_role=role, router=ROUTER)
    return LLM(str(folder), **opts)


@pytest.fixture(scope="module")
def trio(tiny_model_dir, tmp_path_factory):
    folder = tiny_model_dir("LlamaForCausalLM")
    from server.fd_server import free_port

    p = engine(folder, "prefill")
    d = engine(folder, "decode", pd_comm_port=free_port())
    m = engine(folder)
    yield p, d, m
    for llm in (p, d):
        llm.engine.shutdown()


@pytest.fixture
def short_wait(trio):
    """The decode side waits 1.5 s for a transfer (the cases below that never complete)."""
    conn = trio[1].engine.kv_connector
    saved = conn.settings
    conn.settings = dataclasses.replace(saved, timeout_s=1.5)
    yield conn
    conn.settings = saved


def tokens(llm, prompt, **kv):
    (out,) = llm.generate([prompt], params(**kv))
    return out.outputs[0].token_ids


def prefill(p, d, prompt, tid):
    address = d.engine.kv_connector.receiver.address
    (out,) = p.generate(
        [prompt],
        SamplingParams(
            temperature=0,
            max_tokens=1,
            kv_transfer_params={"do_remote_decode": True, "transfer_id": tid, "remote_kv_address": address},
        ),
    )
    return out.outputs[0].token_ids


def decode(d, prompt, tid):
    return tokens(d, prompt, do_remote_prefill=True, transfer_id=tid)


def assert_clean(*llms):
    for llm in llms:
        assert llm.engine.scheduler.kv.num_free_blocks == BLOCKS
        assert not llm.engine.has_unfinished_requests()
    conn = llms[-1].engine.kv_connector
    if conn.staging is not None:
        assert conn.staging.nbytes == 0 and len(conn.staging) == 0
        assert not conn._waiting_since and not conn._load_from


def stats(llm):
    return llm.engine.kv_connector.stats()


def test_decode_loads_prefill_blocks_and_answers_like_mixed(trio):
    p, d, m = trio
    for prompt in prompts_of(3, seed=11, lo=14, hi=30):
        tid = f"t{next(_ids)}"
        before = stats(d)["kv_transfer_loaded_blocks"]
        first = prefill(p, d, prompt, tid)
        got = decode(d, prompt, tid)
        want = tokens(m, prompt)
        assert got == want and first == want[:1]
        assert stats(d)["kv_transfer_loaded_blocks"] - before == (len(prompt) - 1) // BS
    assert_clean(p, d)


def send_frames(address, frames):
    sock = zmq.Context.instance().socket(zmq.PUSH)
    sock.setsockopt(zmq.LINGER, 2000)
    sock.connect(address)
    for f in frames:
        sock.send(ENCODER.encode(f))
    sock.close()


def outgoing(p, d, prompt, tid):
    """The frames the prefill engine would send for `prompt` (its blocks after computing it)."""
    views = p.engine.kv_connector.views
    p.generate([prompt], SamplingParams(temperature=0, max_tokens=1))
    blocks = [views.read(b) for b in range(len(prompt) // BS)]  # any blocks of the right layout
    return Outgoing(d.engine.kv_connector.receiver.address, tid, prompt, BS, part_specs(views.arrays), blocks)


def test_transfer_cut_halfway_times_out_recomputes_and_leaks_nothing(trio, short_wait):
    p, d, m = trio
    (prompt,) = prompts_of(1, seed=12, lo=24, hi=24)
    out = outgoing(p, d, prompt, "cut")
    frames = list(Sender("", 1).frames(out))
    send_frames(out.address, frames[: 1 + len(out.blocks) // 2])  # the start and half the blocks
    timeouts = stats(d)["kv_transfer_timeouts"]
    t0 = time.monotonic()
    assert decode(d, prompt, "cut") == tokens(m, prompt)
    assert time.monotonic() - t0 >= 1.5 and stats(d)["kv_transfer_timeouts"] == timeouts + 1
    time.sleep(1.6)  # the half transfer outlives its ttl: dropped at the next look
    d.engine.kv_connector.staging.get("cut")
    assert_clean(p, d)


def test_wrong_token_is_refused_and_recomputed(trio, short_wait):
    p, d, m = trio
    (prompt,) = prompts_of(1, seed=13, lo=20, hi=20)
    out = outgoing(p, d, prompt, "bad-token")
    send_frames(out.address, Sender("not-the-token", 1).frames(out))
    loaded = stats(d)["kv_transfer_loaded_blocks"]
    assert decode(d, prompt, "bad-token") == tokens(m, prompt)
    assert stats(d)["kv_transfer_loaded_blocks"] == loaded
    assert d.engine.kv_connector.receiver.num_bad_frames > 0
    assert_clean(p, d)


def test_another_prompts_blocks_are_not_loaded(trio):
    p, d, m = trio
    a, b = prompts_of(2, seed=14, lo=20, hi=20)
    prefill(p, d, a, "swap")
    wait_staged(d, "swap")
    loaded, recomputed = stats(d)["kv_transfer_loaded_blocks"], stats(d)["kv_transfer_recomputed"]
    assert decode(d, b, "swap") == tokens(m, b)
    assert stats(d)["kv_transfer_loaded_blocks"] == loaded
    assert stats(d)["kv_transfer_recomputed"] == recomputed + 1
    assert_clean(p, d)


def test_a_transfer_over_the_staging_bound_is_refused(trio):
    p, d, m = trio
    (prompt,) = prompts_of(1, seed=15, lo=20, hi=20)
    staging = d.engine.kv_connector.staging
    saved, staging.max_bytes = staging.max_bytes, staging.part_nbytes[0]  # less than one block
    try:
        refused = staging.num_refused
        prefill(p, d, prompt, "big")
        wait_for(lambda: (s := staging.get("big")) is not None and s.state == "failed")
        assert staging.num_refused == refused + 1 and staging.nbytes == 0
        loaded = stats(d)["kv_transfer_loaded_blocks"]
        assert decode(d, prompt, "big") == tokens(m, prompt)
        assert stats(d)["kv_transfer_loaded_blocks"] == loaded
    finally:
        staging.max_bytes = saved
    assert_clean(p, d)


def wait_staged(d, tid):
    wait_for(lambda: (s := d.engine.kv_connector.staging.get(tid)) is not None and s.state == "complete")


def wait_for(pred, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_a_role_the_engine_lacks_is_a_400_naming_the_field(trio):
    from fdcli_engine.errors import InvalidRequestError

    p, d, m = trio
    cases = [
        (p, {"do_remote_prefill": True, "transfer_id": "x"}),
        (d, {"do_remote_decode": True, "transfer_id": "x", "remote_kv_address": "tcp://127.0.0.1:1"}),
        (m, {"do_remote_prefill": True, "transfer_id": "x"}),
        (p, {"do_remote_decode": True, "transfer_id": "x", "remote_kv_address": "http://x"}),
    ]
    for llm, kv in cases:
        with pytest.raises(InvalidRequestError) as e:
            llm.engine.validate_request([5, 6, 7], params(**kv))
        assert e.value.param == "kv_transfer_params"


def test_binding_beyond_loopback_needs_a_token(monkeypatch):
    monkeypatch.delenv("FD_KV_TRANSFER_TOKEN", raising=False)
    base = dict(splitwise_role="decode", router=ROUTER, cache_transfer_protocol="tcp")
    with pytest.raises(ConfigError, match="--kv-transfer-token"):
        EngineConfig(**base, kv_transfer_host="0.0.0.0").validate()
    EngineConfig(**base, kv_transfer_host="0.0.0.0", kv_transfer_token="s3cret").validate()
    EngineConfig(**base).validate()  # loopback: no token needed
    with pytest.raises(ConfigError, match="needs --router"):
        EngineConfig(splitwise_role="prefill").validate()
    with pytest.raises(ConfigError, match="rdma is not supported"):
        EngineConfig(**{**base, "cache_transfer_protocol": "rdma"}).validate()
    assert EngineConfig(**{**base, "cache_transfer_protocol": "ipc,rdma"}).validate()


def test_a_dead_decode_instance_stalls_no_transfer_to_another(trio, tmp_path):
    # A transfer to an address nobody binds waits out its send timeout on its own lane only.
    p, d, m = trio
    a, b = prompts_of(2, seed=16, lo=20, hi=20)
    dead = {"do_remote_decode": True, "transfer_id": "dead", "remote_kv_address": f"ipc://{tmp_path}/none"}
    p.generate([a], SamplingParams(temperature=0, max_tokens=1, kv_transfer_params=dead))
    loaded = stats(d)["kv_transfer_loaded_blocks"]
    prefill(p, d, b, "alive")
    assert decode(d, b, "alive") == tokens(m, b)
    assert stats(d)["kv_transfer_loaded_blocks"] == loaded + (len(b) - 1) // BS
    assert_clean(p, d)


def test_tcp_transfer_with_a_token(trio, tiny_model_dir, monkeypatch):
    # Both sides read the shared token from the environment (as the engine core inherits it).
    from server.fd_server import free_port

    p, _, m = trio
    monkeypatch.setenv("FD_KV_TRANSFER_TOKEN", "s3cret")
    d = engine(
        tiny_model_dir("LlamaForCausalLM"), "decode", cache_transfer_protocol="tcp", pd_comm_port=free_port()
    )
    try:
        assert d.engine.kv_connector.receiver.address.startswith("tcp://127.0.0.1:")
        (prompt,) = prompts_of(1, seed=17, lo=20, hi=20)
        p.engine.kv_connector.sender.token = "s3cret"  # the prefill engine started without one
        prefill(p, d, prompt, "tcp")
        assert decode(d, prompt, "tcp") == tokens(m, prompt)
        assert stats(d)["kv_transfer_loaded_blocks"] == (len(prompt) - 1) // BS
        assert_clean(p, d)
    finally:
        p.engine.kv_connector.sender.token = ""
        d.engine.shutdown()
