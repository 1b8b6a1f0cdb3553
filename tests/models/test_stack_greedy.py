"""A step's greedy tokens with the forward (DecoderForCausalLM.forward_greedy, ops.decoder_stack_greedy):
the decoder stack's op ends with the LM head and each row's first argmax, as ops.linear_argmax computes
them. The oracle is exact: the hidden states and KV caches of `forward`, and the tokens of
`compute_greedy_tokens` on those hidden states, bit for bit and token for token, on fp32, wint8 and
GGUF (tied Q8_0 head, SmolLM2's layout) weights; and numpy's first argmax of `compute_logits`.
"""

from __future__ import annotations

import numpy as np
import paddle
import pytest
from ops_backend import switched_ops
from tiny_models import load_fd_model, make_attention_metadata, make_tiny_gguf

from fdcli_engine import ops
from fdcli_engine.runner.kv_cache import allocate_kv_caches

BLOCK_SIZE = 4
# (num_computed_tokens, new tokens, blocks) per sequence: a prefill of two prompts, then decode rows.
PREFILL = [(0, 6, [3, 0]), (0, 3, [5])]
DECODE = [(6, 1, [3, 0]), (3, 1, [5])]


@pytest.fixture(autouse=True)
def reference_ops():
    """Overrides the directory's fixture: this module tests the native ops."""
    yield from switched_ops("native")


def load(kind: str, tiny_checkpoint, tmp_path):
    path = tiny_checkpoint("LlamaForCausalLM", seed=4) if kind != "gguf" else None
    if kind == "gguf":
        folder = tiny_checkpoint("LlamaForCausalLM", seed=4, tie_word_embeddings=True)
        path = make_tiny_gguf(folder, tmp_path / "tiny-Q8_0.gguf", "Q8_0")
    return load_fd_model(path, quantization={"fp32": None, "wint8": "wint8", "gguf": "gguf"}[kind])


def run(model, greedy: bool, ids_per_step):
    """Each step's (hidden, tokens) on fresh caches; tokens from forward_greedy, or from
    compute_greedy_tokens after forward. Returns the steps' results and the caches as numpy."""
    caches = allocate_kv_caches(model, 8, BLOCK_SIZE, "bfloat16")
    results = []
    for entries, ids in zip((PREFILL, DECODE), ids_per_step, strict=True):
        meta, positions = make_attention_metadata(entries, BLOCK_SIZE)
        x = paddle.to_tensor(np.asarray(ids, dtype=np.int64))
        if greedy:
            hidden, tokens = model.forward_greedy(x, positions, caches, meta)
        else:
            hidden = model.forward(x, positions, caches, meta)
            tokens = model.compute_greedy_tokens(hidden)
        results.append((hidden.numpy(), tokens))
    return results, [[t.numpy() for t in layer] for layer in caches]


@pytest.mark.parametrize("kind", ["fp32", "wint8", "gguf"])
def test_forward_greedy_equals_forward_then_the_head(kind, tiny_checkpoint, tmp_path):
    model = load(kind, tiny_checkpoint, tmp_path)
    assert model.decoder_stack.has_head and model.decoder_stack.embeds_tokens
    steps = [[5, 17, 42, 99, 3, 8, 250, 7, 11], [60, 61]]
    want, want_caches = run(model, False, steps)
    got, got_caches = run(model, True, steps)
    for (wh, wt), (gh, gt) in zip(want, got, strict=True):
        assert np.isfinite(wh).all() and np.array_equal(wh, gh)
        assert gt == wt and len(gt) == wh.shape[0]
        logits = model.compute_logits(paddle.to_tensor(wh)).numpy()
        assert gt == np.argmax(logits, axis=1).tolist()
    for la, lb in zip(want_caches, got_caches, strict=True):
        assert all(np.array_equal(a, b) for a, b in zip(la, lb, strict=True))


def test_a_decode_step_is_one_call(tiny_checkpoint, tmp_path, monkeypatch):
    """A decode step is one C call: through ctypes (native/stack_step.py, no Paddle op), or, where the
    library lacks that entry, the one `fd_decoder_stack` op."""
    from fd_kernels import native
    from fd_kernels.native import stack_step

    model = load("gguf", tiny_checkpoint, tmp_path)
    caches = allocate_kv_caches(model, 8, BLOCK_SIZE, "bfloat16")
    model.decoder_stack.cache_plan(caches)
    names = []
    run_op = native._run
    monkeypatch.setattr(native, "_run", lambda name, *a: names.append(name) or run_op(name, *a))
    meta, positions = make_attention_metadata(DECODE[:1], BLOCK_SIZE)
    ids = paddle.to_tensor(np.array([9], dtype=np.int64))
    before = stack_step.steps
    _, tokens = model.forward_greedy(ids, positions, caches, meta)
    assert names == [] and stack_step.steps == before + 1 and len(tokens) == 1
    monkeypatch.setattr(stack_step, "_entry", False)
    _, again = model.forward_greedy(ids, positions, caches, meta)
    assert names == ["fd_decoder_stack"] and stack_step.steps == before + 1 and again == tokens


def test_a_nan_logit_gives_no_tokens(tiny_checkpoint, tmp_path):
    """A NaN in a row's logits (here every row's, through the final norm's weight) gives None, as
    linear_argmax does, with the hidden states still returned for the full path."""
    model = load("fp32", tiny_checkpoint, tmp_path)
    np.from_dlpack(model.norm.weight)[0] = np.nan  # the plan points into this tensor
    caches = allocate_kv_caches(model, 8, BLOCK_SIZE, "bfloat16")
    meta, positions = make_attention_metadata(PREFILL, BLOCK_SIZE)
    ids = paddle.to_tensor(np.arange(9, dtype=np.int64))
    hidden, tokens = model.forward_greedy(ids, positions, caches, meta)
    assert tokens is None and model.compute_greedy_tokens(hidden) is None
    assert hidden.shape == [9, model.hidden_size]


def test_no_fused_tokens_where_the_stack_does_not_run(tiny_checkpoint, tmp_path, monkeypatch):
    """The per-op loop, or a stack packed without the head, gives the hidden states alone: the caller
    then asks compute_greedy_tokens. The op refuses greedy tokens of a plan without the head."""
    from fdcli_engine.models import decoder_stack

    model = load("fp32", tiny_checkpoint, tmp_path)
    caches = allocate_kv_caches(model, 8, BLOCK_SIZE, "bfloat16")
    meta, positions = make_attention_metadata(PREFILL, BLOCK_SIZE)
    ids = paddle.to_tensor(np.arange(9, dtype=np.int64))
    want = model.forward(ids, positions, caches, meta).numpy()
    model.use_decoder_stack = False
    hidden, tokens = model.forward_greedy(ids, positions, caches, meta)
    assert tokens is None and np.array_equal(hidden.numpy(), want)
    model.use_decoder_stack = True
    monkeypatch.setattr(decoder_stack, "_head_weight", lambda head: None)
    model.decoder_stack = decoder_stack.build_decoder_stack(model)
    assert not model.decoder_stack.has_head
    with pytest.raises(ValueError, match="without the LM head"):
        ops.decoder_stack_greedy(ids, positions, caches, meta, model.decoder_stack)
    hidden, tokens = model.forward_greedy(ids, positions, caches, meta)
    assert tokens is None and np.array_equal(hidden.numpy(), want)
