"""The fused decoder stack (ops.decoder_stack, kernels/fd_kernels/csrc/decoder_stack.cc) against the
per-op native loop of DecoderForCausalLM.forward, which it replaces.

Both run the same kernels in the same order with the same arguments, so the oracle is exact: hidden
states and KV caches must be bit-identical (np.array_equal), on tiny random Llama / Qwen2 (qkv bias) /
Qwen3 (q/k norm) checkpoints, fp32 / wint8 / wint4 / GGUF weights, fp32, bf16 and int8 (C8) caches,
through prefill, mixed prefill+decode and decode steps whose prompt-row masks (bf16 prompt rows on AMX
CPUs) take every path of the gemm dispatch: all rows, many (AMX tiles) or few (AVX-512) prompt rows, and
none. (The per-op loop's own oracle is the reference ops: tests/engine/test_kv_cache_dtypes.py.)
"""

from __future__ import annotations

import dataclasses

import numpy as np
import paddle
import pytest
from ops_backend import switched_ops
from tiny_models import ARCHITECTURES, load_fd_model, make_attention_metadata, make_tiny_gguf

from fdcli_engine import ops
from fdcli_engine.models.decoder_stack import build_decoder_stack
from fdcli_engine.runner.input_batch import prompt_rows_tensor
from fdcli_engine.runner.kv_cache import allocate_kv_caches

BLOCK_SIZE = 4
# Steps of (seq id, prompt length, new tokens): a token is a prompt token while its position is below the
# prompt length. Token ids are arbitrary (< the tiny vocab of 512).
STEPS = [
    [("a", 10, 10), ("b", 7, 3)],  # 13 prompt rows: AMX tiles on AMX CPUs
    [("a", 10, 1), ("b", 7, 4), ("c", 5, 5)],  # mixed: one decode row among 9 prompt rows
    [("a", 10, 1), ("b", 7, 1), ("c", 5, 1)],  # decode only: no prompt rows
    [("d", 3, 3), ("a", 10, 1)],  # 3 prompt rows (the AVX-512 bf16 path) and a decode row
]


@pytest.fixture(autouse=True)
def reference_ops():
    """Overrides the directory's fixture: this module tests the native ops."""
    yield from switched_ops("native")


def step_batch(step, seqs: dict, free: list, rng) -> tuple[list, list, list]:
    """One step's (attention entries, token ids, prompt-row mask) from its (seq_id, prompt_len, new, ...)
    tuples: each sequence grows by `new` rows, taking blocks from `free` as it needs them."""
    entries, ids, mask = [], [], []
    for seq_id, prompt_len, new, *_ in step:
        seq = seqs.setdefault(seq_id, {"len": 0, "blocks": []})
        while len(seq["blocks"]) * BLOCK_SIZE < seq["len"] + new:
            seq["blocks"].append(int(free.pop()))
        entries.append((seq["len"], new, list(seq["blocks"])))
        mask += [p < prompt_len for p in range(seq["len"], seq["len"] + new)]
        ids += rng.integers(0, 512, new).tolist()
        seq["len"] += new
    return entries, ids, mask


def run_steps(model, use_stack: bool, kv_cache_dtype: str, prompt_rows: bool = True, steps=STEPS):
    """Runs `steps` on fresh caches (shuffled block ids); returns (hidden per step, caches) as numpy."""
    model.use_decoder_stack = use_stack
    num_blocks = max(48, sum(new for step in steps for _, _, new in step) // BLOCK_SIZE + 2 * len(steps))
    caches = allocate_kv_caches(model, num_blocks, BLOCK_SIZE, kv_cache_dtype)
    free = list(np.random.default_rng(0).permutation(num_blocks))
    seqs: dict[str, dict] = {}
    rng = np.random.default_rng(1)
    hidden = []
    for step in steps:
        entries, ids, mask = step_batch(step, seqs, free, rng)
        meta, positions = make_attention_metadata(entries, BLOCK_SIZE)
        if prompt_rows:
            meta = dataclasses.replace(meta, prompt_rows=prompt_rows_tensor(np.asarray(mask)))
        out = model.forward(paddle.to_tensor(np.asarray(ids, dtype=np.int64)), positions, caches, meta)
        hidden.append(out.numpy())
    return hidden, [[t.numpy() for t in layer] for layer in caches]


def assert_bit_identical(model, kv_cache_dtype: str, monkeypatch, steps=STEPS) -> None:
    assert model.decoder_stack is not None, "the stack should apply to this model"
    assert model.decoder_stack.embeds_tokens  # the stack path looks the tokens up itself
    calls = []
    fused = ops.decoder_stack
    monkeypatch.setattr(ops, "decoder_stack", lambda *a: calls.append(1) or fused(*a))
    loop_hidden, loop_caches = run_steps(model, False, kv_cache_dtype, steps=steps)
    assert not calls
    stack_hidden, stack_caches = run_steps(model, True, kv_cache_dtype, steps=steps)
    assert len(calls) == len(steps)  # the stack really ran, every step
    for i, (a, b) in enumerate(zip(loop_hidden, stack_hidden, strict=True)):
        assert a.shape == b.shape and np.isfinite(a).all()
        assert np.array_equal(a, b), f"step {i}: max |diff| {np.abs(a - b).max()}"
    for i, (la, lb) in enumerate(zip(loop_caches, stack_caches, strict=True)):
        for a, b in zip(la, lb, strict=True):
            assert np.array_equal(a, b), f"layer {i} KV cache differs"


@pytest.mark.parametrize("kv_cache_dtype", ["float32", "bfloat16", "int8"])
@pytest.mark.parametrize("quantization", [None, "wint8", "wint4"])
@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_stack_is_bit_identical_to_the_op_loop(
    arch, quantization, kv_cache_dtype, tiny_checkpoint, monkeypatch
):
    model = load_fd_model(tiny_checkpoint(arch), quantization=quantization)
    assert_bit_identical(model, kv_cache_dtype, monkeypatch)


@pytest.mark.parametrize("qtype", ["Q4_1", "Q8_0"])
def test_stack_on_gguf_blocks(qtype, tiny_checkpoint, tmp_path, monkeypatch):
    """SmolLM2's format: GGUF Q4_1 blocks kept quantized (and Q8_0), Llama q/k rows permuted back."""
    path = make_tiny_gguf(tiny_checkpoint("LlamaForCausalLM"), tmp_path / f"tiny-{qtype}.gguf", qtype)
    model = load_fd_model(path, quantization="gguf")
    kinds = {model.layers[0].self_attn.qkv_proj.lw.quantization}
    assert kinds == {f"gguf:{3 if qtype == 'Q4_1' else 8}"}  # really the block kernels
    assert_bit_identical(model, "float32", monkeypatch)


@pytest.mark.parametrize("kv_cache_dtype", ["bfloat16", "int8"])
@pytest.mark.parametrize("arch", ["LlamaForCausalLM", "Qwen3ForCausalLM"])
def test_stack_on_steps_split_over_threads(arch, kv_cache_dtype, tiny_checkpoint, monkeypatch):
    """Steps long enough (>= 2^16 values) that the stack's fused passes (QKV -> rotary -> cache, silu in
    place) split their rows over the threads, with a decode row after them; Qwen3 adds the q/k norms."""
    model = load_fd_model(tiny_checkpoint(arch, max_position_embeddings=1024), quantization="wint8")
    steps = [[("a", 600, 600)], [("a", 600, 1), ("b", 300, 300)]]
    assert_bit_identical(model, kv_cache_dtype, monkeypatch, steps=steps)


@pytest.mark.parametrize("quantization", ["wint4", "gguf"])
def test_stack_on_wider_layers(quantization, tiny_checkpoint, tmp_path, monkeypatch):
    """Layers wide enough (hidden 256) that a prompt of a few row blocks has fewer bytes of activations
    than its weights: the AMX prompt GEMM then gives each thread its own panels, and the add + norm after
    o_proj and down_proj runs on each row block as the thread completing it finishes it. down_proj's K
    (768) is past what one pass keeps in L1, so it also runs in k-slabs with partial sums between them."""
    path = tiny_checkpoint("LlamaForCausalLM", hidden_size=256, intermediate_size=768)
    if quantization == "gguf":
        path = make_tiny_gguf(path, tmp_path / "wide-Q4_1.gguf", "Q4_1")
    model = load_fd_model(path, quantization=quantization)
    steps = [[("a", 100, 100)], [("a", 100, 1), ("b", 70, 70)]]
    assert_bit_identical(model, "bfloat16", monkeypatch, steps=steps)


def test_stack_on_smollm2_width_down_proj(tiny_checkpoint, monkeypatch):
    """SmolLM2-135M's MLP widths (hidden 576, intermediate 1536) on prompts of 16 row blocks and more: the
    stack's down_proj (silu fused into its conversion, three k-slabs, panel regions, the add + norm epilogue
    per row block) against the op loop's; the second step's last row block is partial, and the third step
    mixes in a decode row."""
    path = tiny_checkpoint(
        "LlamaForCausalLM", hidden_size=576, intermediate_size=1536, max_position_embeddings=2048
    )
    model = load_fd_model(path, quantization="wint8")
    steps = [[("a", 512, 512)], [("b", 600, 600)], [("a", 512, 1), ("c", 520, 520)]]
    assert_bit_identical(model, "bfloat16", monkeypatch, steps=steps)


@pytest.mark.parametrize("quantization", ["wint8", "wint4"])
@pytest.mark.parametrize("intermediate", [208, 200])
def test_stack_on_half_panel_intermediate(intermediate, quantization, tiny_checkpoint, monkeypatch):
    """Prompts whose rows all take the AMX tiles write gate_up's products straight into down_proj's A tiles
    as silu(gate) * up. An intermediate size of 13 column halves (208) starts the up columns mid-panel and
    ends down_proj's K in half a k-step of zero padding; 200 (not whole halves) keeps the two GEMMs apart.
    The prompts end in partial row blocks, one of them a single block; the second step mixes in a decode
    row (the unfused path on the same weights)."""
    path = tiny_checkpoint("LlamaForCausalLM", intermediate_size=intermediate)
    model = load_fd_model(path, quantization=quantization)
    steps = [[("a", 45, 45)], [("a", 45, 1), ("b", 70, 70)], [("c", 20, 20)], [("d", 100, 100)]]
    assert_bit_identical(model, "bfloat16", monkeypatch, steps=steps)


def test_stack_on_ernie_dense_and_not_on_moe(tiny_checkpoint, monkeypatch):
    """ERNIE-4.5 dense is the same layer structure (its interleaved rotary is a load-time permutation);
    ERNIE MoE layers are not, so that model keeps the per-op loop."""
    dense = load_fd_model(tiny_checkpoint("Ernie4_5ForCausalLM", head_dim=16), quantization="wint8")
    assert_bit_identical(dense, "int8", monkeypatch)
    moe = tiny_checkpoint(
        "Ernie4_5_MoeForCausalLM",
        head_dim=16,
        num_hidden_layers=2,
        moe_num_experts=4,
        moe_k=2,
        moe_intermediate_size=32,
        moe_layer_start_index=1,
    )
    moe_model = load_fd_model(moe)
    assert moe_model.moe_layer_ids == [1]  # layer 0 is dense: the MoE layer alone disqualifies
    assert moe_model.decoder_stack is None


def test_prompt_rows_reach_the_stack(tiny_checkpoint):
    """On the bf16 levels the mask changes quantized results (bf16 prompt rows), so the stack must see it."""
    from fd_kernels import native

    if native.active_isa() not in native.BF16_PROMPT_ISAS:
        pytest.skip("prompt rows only change numerics on the bf16 levels (AMX, AVX512-BF16)")
    model = load_fd_model(tiny_checkpoint("LlamaForCausalLM"), quantization="wint4")
    with_mask, _ = run_steps(model, True, "float32")
    without, _ = run_steps(model, True, "float32", prompt_rows=False)
    assert not np.array_equal(with_mask[0], without[0])  # step 0 is all prompt rows
    loop_without, _ = run_steps(model, False, "float32", prompt_rows=False)
    assert all(np.array_equal(a, b) for a, b in zip(without, loop_without, strict=True))


def test_stack_only_where_it_applies(tiny_checkpoint, monkeypatch):
    folder = tiny_checkpoint("Qwen3ForCausalLM")
    model = load_fd_model(folder)
    assert model.decoder_stack is not None
    # A layer of another structure (an MoE FFN, say) keeps the whole model on the per-op loop.
    model.layers[1].mlp = object()
    assert build_decoder_stack(model) is None
    monkeypatch.setenv("FD_DECODER_STACK", "0")
    assert load_fd_model(folder).decoder_stack is None
    monkeypatch.delenv("FD_DECODER_STACK")
    ops.use("reference")
    assert ops.decoder_stack is None
    assert load_fd_model(folder).decoder_stack is None


def test_bad_metadata_is_a_clear_error(tiny_checkpoint):
    model = load_fd_model(tiny_checkpoint("LlamaForCausalLM"))
    caches = allocate_kv_caches(model, 4, BLOCK_SIZE)
    meta, positions = make_attention_metadata([(0, 3, [0])], BLOCK_SIZE)
    x = paddle.zeros([3, model.hidden_size])
    meta.slot_mapping = paddle.to_tensor(np.array([0, 1, 999], dtype=np.int64))  # beyond 4 blocks of 4
    with pytest.raises(ValueError, match="slot 999 beyond the cache"):
        ops.decoder_stack(x, positions, caches, meta, model.decoder_stack)
    with pytest.raises(ValueError, match="KV caches must be 2"):
        ops.decoder_stack(x, positions, caches[:1], meta, model.decoder_stack)
    mixed = caches[:1] + allocate_kv_caches(model, 4, BLOCK_SIZE, "bfloat16")[1:]
    with pytest.raises(ValueError, match="of layer 0's dtype"):
        ops.decoder_stack(x, positions, mixed, meta, model.decoder_stack)
    from fd_kernels.native import DecoderStack

    fake = DecoderStack(plan=paddle.zeros([64], dtype="int64"), tensors=[])
    with pytest.raises(ValueError, match="not a plan"):
        ops.decoder_stack(x, positions, caches, meta, fake)


@pytest.mark.parametrize("gguf", [False, True])
def test_stack_takes_token_ids(gguf, tiny_checkpoint, tmp_path, monkeypatch):
    """With the embedding's table in its plan (fp32 rows, or GGUF blocks as ops.embedding reads them),
    the stack takes token ids: the same bits as given the embedded rows, and a decode step's forward is
    one custom op."""
    from fd_kernels import native

    path = tiny_checkpoint("LlamaForCausalLM")
    if gguf:
        path = make_tiny_gguf(path, tmp_path / "tiny-Q8_0.gguf", "Q8_0")
    model = load_fd_model(path, quantization="gguf" if gguf else None)
    assert (model.embed_tokens.lw is not None) == gguf
    stack = model.decoder_stack
    ids = paddle.to_tensor(np.array([5, 511, 0, 77], dtype=np.int64))
    results = []
    for x in (ids, model.embed_tokens(ids)):
        caches = allocate_kv_caches(model, 8, BLOCK_SIZE, "bfloat16")
        meta, positions = make_attention_metadata([(0, 4, [1, 0])], BLOCK_SIZE)
        results.append((ops.decoder_stack(x, positions, caches, meta, stack).numpy(), caches[0][0].numpy()))
    assert np.isfinite(results[0][0]).all()
    assert np.array_equal(results[0][0], results[1][0]) and np.array_equal(results[0][1], results[1][1])

    caches = allocate_kv_caches(model, 8, BLOCK_SIZE, "bfloat16")
    stack.cache_plan(caches)  # bound once, outside the step
    names = []
    run = native._run
    monkeypatch.setattr(native, "_run", lambda name, *a: names.append(name) or run(name, *a))
    meta, positions = make_attention_metadata([(6, 1, [1, 0])], BLOCK_SIZE)
    model.forward(paddle.to_tensor(np.array([9], dtype=np.int64)), positions, caches, meta)
    assert names == ["fd_decoder_stack"]


def test_bad_token_ids_are_a_clear_error(tiny_checkpoint, monkeypatch):
    """An id outside the table is refused as ops.embedding refuses it; a stack packed without the table
    refuses ids, and the model then embeds the tokens itself (the same bits)."""
    from fdcli_engine.models import decoder_stack

    model = load_fd_model(tiny_checkpoint("LlamaForCausalLM"))
    caches = allocate_kv_caches(model, 4, BLOCK_SIZE)
    meta, positions = make_attention_metadata([(0, 2, [0])], BLOCK_SIZE)
    ids = paddle.to_tensor(np.array([3, 512], dtype=np.int64))  # the tiny vocab is 512
    with pytest.raises(ValueError, match="token id 512 is outside the vocabulary"):
        ops.decoder_stack(ids, positions, caches, meta, model.decoder_stack)
    ids = paddle.to_tensor(np.array([3, 7], dtype=np.int64))
    expected = model.forward(ids, positions, caches, meta).numpy()
    monkeypatch.setattr(decoder_stack, "_token_table", lambda embed: None)
    model.decoder_stack = build_decoder_stack(model)
    assert not model.decoder_stack.embeds_tokens
    with pytest.raises(ValueError, match="holds no embedding"):
        ops.decoder_stack(ids, positions, caches, meta, model.decoder_stack)
    assert np.array_equal(model.forward(ids, positions, caches, meta).numpy(), expected)


def test_cache_plan_binds_again_only_for_other_tensors(tiny_checkpoint, monkeypatch):
    """The cache plan is bound once for the runner's caches; a replaced layer, or a tensor swapped
    inside a mutable container, binds again."""
    from fd_kernels import native

    model = load_fd_model(tiny_checkpoint("LlamaForCausalLM"))
    stack = model.decoder_stack
    binds = []
    run = native._run
    monkeypatch.setattr(native, "_run", lambda name, *a: binds.append(name) or run(name, *a))
    caches = allocate_kv_caches(model, 4, BLOCK_SIZE)
    other = allocate_kv_caches(model, 4, BLOCK_SIZE)
    plan = stack.cache_plan(caches)
    assert stack.cache_plan(caches) is plan and stack.cache_plan(list(caches)) is plan
    caches[1] = other[1]
    replaced = stack.cache_plan(caches)
    assert replaced is not plan
    lists = [list(layer) for layer in caches]  # the same tensors in mutable containers
    assert stack.cache_plan(lists) is replaced
    lists[0][1] = other[0][1]
    assert stack.cache_plan(lists) is not replaced
    assert stack.cache_plan(lists) is stack.cache_plan(lists)
    assert binds == ["fd_decoder_stack_bind"] * 3
