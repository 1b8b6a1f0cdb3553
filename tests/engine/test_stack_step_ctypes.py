"""The greedy decode step through ctypes (fd_kernels/native/stack_step.py, `fd_decoder_stack_greedy_host`):
an all-greedy decode step of the native stack skips Paddle's custom-op dispatch, and must give what the
`fd_decoder_stack` op gives, token for token, over whole greedy generations of a tiny random checkpoint
and of SmolLM2; bad input must raise the op's ValueError, never crash the process."""

from __future__ import annotations

import numpy as np
import paddle
import pytest
from ops_backend import switched_ops
from tiny_models import make_attention_metadata

from fdcli_engine import LLM, SamplingParams, ops

PROMPTS = [[5, 17, 42, 99, 3], [250, 7], [11] * 9]


@pytest.fixture(autouse=True)
def native_ops():
    yield from switched_ops("native")


def stack_step():
    from fd_kernels.native import stack_step  # noqa: PLC0415

    return stack_step


def generate(llm, prompts, params, through_ctypes: bool, monkeypatch) -> tuple[list[list[int]], int]:
    """The generated tokens, and the steps taken through ctypes meanwhile. Without ctypes, the C entry
    reads as absent: every step then runs the Paddle op."""
    mod = stack_step()
    with monkeypatch.context() as m:
        if not through_ctypes:
            m.setattr(mod, "_entry", False)
        before = mod.steps
        outs = llm.generate(prompts, params)
        return [o.outputs[0].token_ids for o in outs], mod.steps - before


def check_generations(llm, prompts, max_tokens, monkeypatch):
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    for batch in ([prompts[0]], prompts):  # batch 1, then several requests decoding together
        want, none = generate(llm, batch, params, False, monkeypatch)
        got, taken = generate(llm, batch, params, True, monkeypatch)
        assert none == 0
        assert got == want and all(len(t) == max_tokens for t in got)
        assert taken >= max_tokens - 1  # every decode step after the prefill


def test_tiny_greedy_generation_equals_the_op(tiny_model_dir, monkeypatch):
    llm = LLM(str(tiny_model_dir()), max_model_len=128, block_size=8, max_num_seqs=4)
    assert llm.engine.runner.model.decoder_stack.has_head
    check_generations(llm, PROMPTS, 16, monkeypatch)


@pytest.mark.slow
def test_smollm2_greedy_generation_equals_the_op(monkeypatch):
    llm = LLM(None, max_model_len=256)
    prompts = [[1, 9690, 198, 2683, 314, 253, 5356, 30], [100 + (i * 7919) % 30000 for i in range(24)]]
    check_generations(llm, prompts, 12, monkeypatch)


def one_step(llm, token: int = 9, blocks=(1,), position: int | None = None):
    """A one-row decode step's arguments on the engine's model and caches (at position 3, its slot in
    `blocks`; `position` then overrides the rotary position alone)."""
    runner = llm.engine.runner
    meta, positions = make_attention_metadata([(3, 1, list(blocks))], runner.block_size)
    if position is not None:
        positions = paddle.to_tensor(np.array([position], dtype=np.int64))
    ids = paddle.to_tensor(np.array([token], dtype=np.int64))
    return ids, positions, runner.kv_caches, meta, runner.model.decoder_stack


def test_a_step_equals_the_op_hidden_and_tokens(tiny_model_dir, monkeypatch):
    llm = LLM(str(tiny_model_dir()), max_model_len=128, block_size=8, max_num_seqs=4)
    args = one_step(llm)
    mod = stack_step()
    before = mod.steps
    hidden, tokens = ops.decoder_stack_greedy(*args)
    got = hidden.numpy().copy()
    assert mod.steps == before + 1
    monkeypatch.setattr(mod, "_entry", False)
    want_hidden, want_tokens = ops.decoder_stack_greedy(*args)
    assert mod.steps == before + 1
    assert tokens == want_tokens and np.array_equal(got, want_hidden.numpy())


@pytest.mark.parametrize(
    ("step", "message"),
    [
        (dict(token=10**6), "outside the vocabulary"),
        (dict(blocks=(10**6,)), "beyond the cache"),
        (dict(position=10**6), "out of range"),
    ],
)
def test_bad_input_raises_the_ops_error(tiny_model_dir, monkeypatch, step, message):
    llm = LLM(str(tiny_model_dir()), max_model_len=128, block_size=8, max_num_seqs=4)
    args = one_step(llm, **step)
    mod = stack_step()
    with pytest.raises(ValueError, match=message) as through_ctypes:
        ops.decoder_stack_greedy(*args)
    monkeypatch.setattr(mod, "_entry", False)
    with pytest.raises(ValueError, match=message) as through_op:
        ops.decoder_stack_greedy(*args)
    assert str(through_ctypes.value) in str(through_op.value)
    # The process and the stack go on: a good step still runs through ctypes.
    monkeypatch.undo()
    before = mod.steps
    _, tokens = ops.decoder_stack_greedy(*one_step(llm))
    assert mod.steps == before + 1 and len(tokens) == 1


def test_a_bad_plan_handle_raises(tiny_model_dir):
    llm = LLM(str(tiny_model_dir()), max_model_len=128, block_size=8, max_num_seqs=4)
    ids, positions, caches, meta, stack = one_step(llm)
    mod = stack_step()
    bogus = paddle.to_tensor(np.zeros(8, dtype=np.int64))
    with pytest.raises(ValueError, match="plan is not a plan built by fd_kernels.native"):
        mod.greedy_step(
            ids, positions, meta, bogus, stack.cache_plan(caches), mod.StepBuffers(stack.hidden_size)
        )
    with pytest.raises(ValueError, match="cache plan is not a plan built by fd_kernels.native"):
        mod.greedy_step(ids, positions, meta, stack.plan, stack.plan, mod.StepBuffers(stack.hidden_size))
