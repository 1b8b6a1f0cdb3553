"""The runner's step inputs live in buffers refilled every step (runner/input_batch.InputBuffers): every
step's tensors must hold exactly what fresh tensors built from that step alone hold, whatever the steps
before it were (requests joining and leaving, a preempted request back on new blocks, draft rows,
block tables growing), and an engine on the buffers must answer as one building new tensors each step."""

from __future__ import annotations

import random

import numpy as np
from test_engine_e2e import prompts_of

from fdcli_engine import LLM, SamplingParams
from fdcli_engine.runner import input_batch
from fdcli_engine.runner.input_batch import InputBuffers, build_inputs
from fdcli_engine.step_types import ScheduledRequest

BLOCK = 4


def _req(rid, tokens, computed, blocks, prompt_len, drafts=()):
    return ScheduledRequest(
        rid,
        list(tokens) + list(drafts),
        computed,
        list(blocks),
        SamplingParams(),
        True,
        prompt_token_ids=list(range(1, prompt_len + 1)),
        spec_token_ids=list(drafts),
    )


def _steps() -> list[list[ScheduledRequest]]:
    a1 = _req("a", [11], 9, [3, 4, 5], 6)
    b1 = _req("b", [12], 5, [7, 8], 5)
    return [
        [_req("a", range(1, 7), 0, [3, 4], 6), _req("b", range(1, 5), 0, [7], 5)],  # two prefills
        [a1, b1],  # two decodes
        [_req("a", [13], 10, [3, 4, 5], 6), _req("b", [14], 6, [7, 8], 5)],  # same shapes, new values
        [_req("b", [15], 7, [7, 8], 5), _req("c", [16], 3, [9], 3)],  # a left, c joined: same shapes
        [_req("c", [17], 4, [9, 10], 3)],  # b left; c's table grew
        # b preempted and back on other blocks at a prompt position: one row, now a prompt row
        [_req("b", [5], 4, [1, 2], 5), _req("c", [18], 5, [9, 10], 3)],
        [_req("b", [21], 8, [1, 2, 6], 5, drafts=[22, 23]), _req("c", [19], 6, [9, 10], 3, drafts=[24, 25])],
        [b1, _req("c", [20], 7, [9, 10], 3)],  # back to the shapes of step 1
    ]


def _as_arrays(inputs) -> dict:
    m = inputs.meta
    out = {
        "input_ids": inputs.input_ids,
        "positions": inputs.positions,
        "slot_mapping": m.slot_mapping,
        "query_start_loc": m.query_start_loc,
        "seq_lens": m.seq_lens,
        "block_tables": m.block_tables,
        "prompt_rows": m.prompt_rows,
    }
    arrays = {k: None if t is None else (str(t.dtype), t.numpy().copy()) for k, t in out.items()}
    arrays["host"] = (m.query_start_loc_np.tolist(), m.seq_lens_np.tolist(), inputs.last_token_rows.tolist())
    arrays["lens"] = (m.max_query_len, m.max_seq_len)
    return arrays


def _assert_equal(got: dict, want: dict, step: int) -> None:
    assert got.keys() == want.keys()
    for k in want:
        g, w = got[k], want[k]
        if isinstance(w, tuple) and len(w) == 2 and isinstance(w[1], np.ndarray):
            assert g[0] == w[0], f"step {step}: {k} dtype"
            assert np.array_equal(g[1], w[1]), f"step {step}: {k} {g[1]} != {w[1]}"
        else:
            assert g == w, f"step {step}: {k}"


def test_every_step_holds_what_fresh_tensors_hold():
    buffers = InputBuffers()
    held = []
    for i, step in enumerate(_steps()):
        inputs = build_inputs(step, BLOCK, mark_prompt_rows=True, buffers=buffers)
        held.append(inputs.meta.seq_lens)
        _assert_equal(_as_arrays(inputs), _as_arrays(build_inputs(step, BLOCK, mark_prompt_rows=True)), i)
    # The buffers were reused (steps 1-3 and 7 have one shape), not made anew each step.
    assert held[1] is held[2] is held[3] is held[7]


def test_the_preempted_request_back_on_new_blocks_writes_them():
    buffers = InputBuffers()
    steps = _steps()
    build_inputs(steps[4], BLOCK, mark_prompt_rows=True, buffers=buffers)
    inputs = build_inputs(steps[5], BLOCK, mark_prompt_rows=True, buffers=buffers)
    # b's token at position 4 goes to its new block 2 (slot 8), c's at 5 to block 10 (slot 41).
    assert inputs.meta.slot_mapping.numpy().tolist() == [2 * BLOCK + 0, 10 * BLOCK + 1]
    assert inputs.meta.block_tables.numpy().tolist() == [[1, 2], [9, 10]]
    assert inputs.meta.prompt_rows.numpy().tolist() == [1, 0]


def test_one_row_steps_get_the_arrays_of_the_general_path():
    # Decode steps take their own path (input_batch._one_row_arrays): the same arrays as any step's.
    rng = random.Random(5)
    for trial in range(200):
        step = []
        for i in range(rng.randint(1, 9)):
            position = rng.randrange(0, 60)
            blocks = rng.sample(range(100), position // BLOCK + 1 + rng.randint(0, 2))
            prompt_len = rng.choice([position + 1, position, max(1, position - 3)])  # some prompt rows
            step.append(_req(str(i), [rng.randrange(1000)], position, blocks, prompt_len))
        one, general = input_batch._one_row_arrays(step, BLOCK), input_batch._varlen_arrays(step, BLOCK)
        for name in ("input_ids", "positions", "slot_mapping", "query_start_loc", "seq_lens", "block_tables"):
            a, b = getattr(one, name), getattr(general, name)
            assert a.dtype == b.dtype and np.array_equal(a, b), f"trial {trial}: {name}"
        assert one.max_query_len == general.max_query_len == 1
        # None stands for a mask without any prompt row.
        want = general.prompt_mask if general.prompt_mask.any() else None
        assert (one.prompt_mask is None) == (want is None), f"trial {trial}: prompt rows"
        if want is not None:
            assert np.array_equal(one.prompt_mask, want), f"trial {trial}: prompt rows"


def test_one_request_steps_get_the_arrays_of_the_general_path():
    # A step of one request with several rows (a prompt, a chunk of one, draft rows to verify) takes
    # its own path (input_batch._one_seq_arrays): the same arrays as any step's.
    rng = random.Random(7)
    for trial in range(300):
        start = rng.randrange(0, 60)
        n = rng.randint(2, 40)
        blocks = rng.sample(range(100), (start + n - 1) // BLOCK + 1 + rng.randint(0, 2))
        prompt_len = rng.choice([start + n, start + n + 5, start + rng.randint(0, n), max(1, start - 3)])
        step = [_req("r", [rng.randrange(1000) for _ in range(n)], start, blocks, prompt_len)]
        one, general = input_batch._one_seq_arrays(step[0], BLOCK), input_batch._varlen_arrays(step, BLOCK)
        for name in (
            "input_ids",
            "positions",
            "slot_mapping",
            "query_start_loc",
            "seq_lens",
            "block_tables",
            "prompt_mask",
        ):
            a, b = getattr(one, name), getattr(general, name)
            assert a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b), (
                f"trial {trial}: {name}"
            )
        assert one.max_query_len == general.max_query_len == n


def _generate(model_dir, fresh: bool):
    llm = LLM(str(model_dir), max_model_len=64, block_size=BLOCK, max_num_seqs=4, num_kv_blocks=20)
    if fresh:
        llm.engine.runner.input_buffers = None  # build_inputs makes new tensors every step
    prompts = prompts_of(12, seed=11, lo=3, hi=30)
    # Different lengths: requests leave at different steps and the waiting ones join; the small pool
    # preempts.
    params = [SamplingParams(temperature=0, max_tokens=4 + 5 * (i % 5), ignore_eos=True) for i in range(12)]
    outs = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
    return outs, llm.get_stats()["num_preemptions"]


def test_engine_answers_as_with_fresh_tensors(tiny_model_dir):
    model_dir = tiny_model_dir("LlamaForCausalLM")
    fresh, _ = _generate(model_dir, fresh=True)
    buffered, preemptions = _generate(model_dir, fresh=False)
    assert buffered == fresh
    assert preemptions > 0


def test_decode_steps_written_in_place_hold_what_fresh_tensors_hold():
    # Decode steps write straight into their own buffers (InputBuffers.one_row_inputs), rewriting a
    # block-table row only when its request's blocks differ: requests come and go between steps, their
    # blocks are replaced at the same table width, tables grow and shrink, prompt rows interleave.
    rng = random.Random(7)
    buffers = InputBuffers()
    for trial in range(300):
        step = []
        for i in range(rng.randint(1, 4)):
            position = rng.randrange(0, 24)
            blocks = rng.sample(range(40), position // BLOCK + 1 + rng.randint(0, 2))
            prompt_len = position if rng.random() < 0.9 else position + 1
            step.append(
                _req(rng.choice("abcdef") + str(i), [rng.randrange(1000)], position, blocks, prompt_len)
            )
        decode = buffers.one_row_inputs(step, BLOCK) is not None
        assert decode == all(s.num_computed_tokens >= len(s.prompt_token_ids) for s in step), f"trial {trial}"
        got = build_inputs(step, BLOCK, mark_prompt_rows=True, buffers=buffers)
        _assert_equal(_as_arrays(got), _as_arrays(build_inputs(step, BLOCK, mark_prompt_rows=True)), trial)
