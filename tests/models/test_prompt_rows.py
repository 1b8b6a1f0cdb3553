"""The step's prompt-row mask is an argument, not a module global: the generation runner's inputs carry it
on AttentionMetadata.prompt_rows, and the forward pass hands that tensor to every linear (on AMX CPUs the
native linear computes those rows of quantized weights in bf16: csrc/amx.cc). The pooling runner marks
none. On other CPUs the mask does not change numerics, so these tests check the plumbing itself."""

from __future__ import annotations

import dataclasses

import numpy as np
import paddle
import pytest
from tiny_models import load_fd_model, make_attention_metadata

from fdcli_engine import ops
from fdcli_engine.runner.input_batch import build_inputs, prompt_rows_tensor
from fdcli_engine.runner.kv_cache import allocate_kv_caches
from fdcli_engine.sampling_params import SamplingParams
from fdcli_engine.step_types import ScheduledRequest


def _step() -> list[ScheduledRequest]:
    # "a": the first 3 tokens of a 5-token prompt; "b": a 3-token prompt, decoding its first output token.
    a = ScheduledRequest("a", [1, 2, 3], 0, [0, 1], SamplingParams(), False, prompt_token_ids=[1, 2, 3, 4, 5])
    b = ScheduledRequest("b", [9], 3, [2], SamplingParams(), True, [9], prompt_token_ids=[6, 7, 8])
    return [a, b]


def test_the_generation_inputs_mark_the_prompt_rows():
    meta = build_inputs(_step(), 4, mark_prompt_rows=True).meta
    assert meta.prompt_rows.dtype == paddle.uint8
    assert meta.prompt_rows.numpy().tolist() == [1, 1, 1, 0]


def test_no_mask_without_prompt_rows_or_when_not_asked():
    assert build_inputs(_step(), 4).meta.prompt_rows is None  # the pooling runner's call
    decode = [_step()[1]]
    assert build_inputs(decode, 4, mark_prompt_rows=True).meta.prompt_rows is None
    assert prompt_rows_tensor(np.zeros(3, dtype=bool)) is None


@pytest.mark.parametrize(
    "arch,overrides",
    [
        ("Qwen3ForCausalLM", {}),
        (
            "Ernie4_5_MoeForCausalLM",
            dict(head_dim=16, num_hidden_layers=2, moe_num_experts=4, moe_k=2, moe_intermediate_size=32),
        ),
    ],
)
def test_every_linear_of_the_forward_gets_the_steps_mask(arch, overrides, tiny_checkpoint, monkeypatch):
    model = load_fd_model(tiny_checkpoint(arch, **overrides))
    received = []
    linear = ops.linear
    monkeypatch.setattr(ops, "linear", lambda x, lw, rows=None: received.append(rows) or linear(x, lw, rows))
    meta, positions = make_attention_metadata([(0, 4, [0]), (0, 2, [1])], 4)
    rows = prompt_rows_tensor(np.array([True, True, True, True, True, False]))
    meta = dataclasses.replace(meta, prompt_rows=rows)
    caches = allocate_kv_caches(model, 4, 4, "float32")
    ids = paddle.to_tensor(np.arange(6, dtype=np.int64))
    model.forward(ids, positions, caches, meta)
    assert len(received) >= 4 * model.num_layers  # qkv, o_proj, gate_up, down (experts: more)
    assert all(r is rows for r in received)
    received.clear()
    model.compute_logits(paddle.zeros([2, model.hidden_size]))
    assert received in ([], [None])  # the LM head, over the sampled rows, is not a prompt-row linear
