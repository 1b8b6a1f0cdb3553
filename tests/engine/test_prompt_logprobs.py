"""SamplingParams.prompt_logprobs on the whole engine: vLLM's shape, values against a transformers
forward's log_softmax on the tiny random models, chunked prefill, the prefix cache and preemption.

Tolerances (|fd - transformers| on the prompt tokens' logprobs, from measurement on these seeds with
about 2-3x margin): fp32 KV cache, at most 5e-6 (mean 9e-7) on both ops backends: allowed 5e-5 and 5e-6;
bf16 cache (8 significant bits per K/V value), at most 0.021 (mean 0.0035): allowed 0.05 and 0.01;
int8 cache, at most 0.061 (mean 0.011): allowed 0.15 and 0.03. The first prompt position has no logprob.
"""

from __future__ import annotations

import numpy as np
import pytest
import tiny_models
from test_engine_e2e import prompts_of

from fdcli_engine import LLM, SamplingParams
from fdcli_engine.errors import InvalidRequestError
from fdcli_engine.outputs import Logprob

TOLERANCE = {"float32": (5e-5, 5e-6), "bfloat16": (0.05, 0.01), "int8": (0.15, 0.03)}
K = 3


def hf_log_softmax(folder, prompts):
    import torch

    hf = tiny_models.load_hf_model(folder)
    with torch.no_grad():
        return [torch.log_softmax(hf(torch.tensor([p])).logits[0].double(), -1).numpy() for p in prompts]


@pytest.fixture(scope="module")
def llama(tiny_model_dir):
    folder = tiny_model_dir("LlamaForCausalLM")
    prompts = prompts_of(4, seed=5, lo=10, hi=60)
    return folder, prompts, hf_log_softmax(folder, prompts)


def check_against(prompts, outs, refs, kv: str, k: int = K) -> None:
    max_atol, mean_atol = TOLERANCE[kv]
    diffs = []
    for p, out, ref in zip(prompts, outs, refs):
        pl = out.prompt_logprobs
        assert len(pl) == len(p) and pl[0] is None
        for pos in range(1, len(p)):
            entry, row = pl[pos], ref[pos - 1]
            own = entry[p[pos]]
            assert next(iter(entry)) == p[pos]  # the prompt token's entry first, as in vLLM
            assert isinstance(own, Logprob) and own.token_id == p[pos]
            diffs.append(abs(own.logprob - row[p[pos]]))
            assert len(entry) in (k, k + 1)
            if kv == "float32":  # ranks and the top-k set are exact where the values are
                assert own.rank == 1 + int((row > row[p[pos]]).sum())
                want_top = list(np.argsort(-row, kind="stable")[:k])
                got_top = sorted(
                    (t for t in entry if t != p[pos] or own.rank <= k), key=lambda t: entry[t].rank
                )
                assert got_top == want_top
                assert [entry[t].rank for t in got_top] == list(range(1, k + 1))
    assert max(diffs) <= max_atol and float(np.mean(diffs)) <= mean_atol, (max(diffs), np.mean(diffs))


@pytest.mark.parametrize("backend", ["reference", "native"])
@pytest.mark.parametrize("kv", ["float32", "bfloat16", "int8"])
def test_prompt_logprobs_equal_transformers(llama, kv, backend):
    """Chunked prefill (32-token steps over prompts up to 60 tokens): each chunk's rows are computed."""
    from fdcli_engine import ops

    previous = ops.backend
    try:
        ops.use(backend)
    except RuntimeError:
        pytest.skip("native kernels unavailable")
    try:
        folder, prompts, refs = llama
        llm = LLM(
            str(folder),
            max_model_len=128,
            block_size=8,
            num_kv_blocks=64,
            max_num_batched_tokens=32,
            kv_cache_dtype=kv,
        )
        outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=1, prompt_logprobs=K))
        check_against(prompts, outs, refs, kv)
    finally:
        ops.use(previous)


@pytest.mark.parametrize("arch", ["Qwen2ForCausalLM", "Qwen3ForCausalLM"])
def test_other_architectures(tiny_model_dir, arch):
    folder = tiny_model_dir(arch)
    prompts = prompts_of(2, seed=6, lo=5, hi=30)
    llm = LLM(str(folder), max_model_len=128, block_size=8, num_kv_blocks=64)
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=2, prompt_logprobs=K))
    check_against(prompts, outs, hf_log_softmax(folder, prompts), "float32")


def test_zero_gives_only_the_prompt_token_and_decoded_text(llama):
    folder, prompts, refs = llama
    llm = LLM(str(folder), max_model_len=128, block_size=8, num_kv_blocks=64)
    out = llm.generate([prompts[0]], SamplingParams(temperature=0, max_tokens=1, prompt_logprobs=0))[0]
    p = prompts[0]
    for pos in range(1, len(p)):
        assert list(out.prompt_logprobs[pos]) == [p[pos]]
        lp = out.prompt_logprobs[pos][p[pos]]
        assert lp.decoded_token == llm.tokenizer.decode([p[pos]], skip_special_tokens=False)
        assert abs(lp.logprob - refs[0][pos - 1][p[pos]]) <= TOLERANCE["float32"][0]


def test_only_requests_that_ask_get_them_and_outputs_do_not_change(llama):
    folder, prompts, _ = llama
    llm = LLM(str(folder), max_model_len=128, block_size=8, num_kv_blocks=64)
    greedy = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    plain = llm.generate(prompts, greedy)
    mixed = llm.generate(
        prompts,
        [
            SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, prompt_logprobs=1 if i % 2 else None)
            for i in range(len(prompts))
        ],
    )
    for i, (a, b) in enumerate(zip(plain, mixed)):
        assert a.outputs[0].token_ids == b.outputs[0].token_ids
        assert a.prompt_logprobs is None
        assert (b.prompt_logprobs is not None) == bool(i % 2)


def test_a_cached_prefix_is_recomputed_for_prompt_logprobs(llama):
    """vLLM's rule: a request asking for prompt logprobs takes no prefix-cache hit."""
    folder, prompts, refs = llama
    llm = LLM(str(folder), max_model_len=128, block_size=8, num_kv_blocks=64, enable_prefix_caching=True)
    params = SamplingParams(temperature=0, max_tokens=1)
    warm = llm.generate([prompts[1]], params)[0]
    again = llm.generate([prompts[1]], params)[0]
    assert warm.num_cached_tokens == 0 and again.num_cached_tokens > 0  # the cache does hit
    out = llm.generate([prompts[1]], SamplingParams(temperature=0, max_tokens=1, prompt_logprobs=1))[0]
    assert out.num_cached_tokens == 0
    check_against([prompts[1]], [out], [refs[1]], "float32", k=1)


def test_preemption_mid_prefill_does_not_repeat_them(tiny_model_dir):
    """Three ~100-token prompts in 32 blocks of 4 (one prompt's worth): a request is preempted in the
    middle of its chunked prefill and recomputed from the start; it still gets one entry per prompt
    position, equal to transformers'."""
    from fdcli_engine import request

    folder = tiny_model_dir("LlamaForCausalLM")
    prompts = prompts_of(3, seed=7, lo=90, hi=110)
    recomputed = []
    add = request.Request.add_prompt_logprobs

    def spy(self, first, entries):
        recomputed.append(len(self.prompt_logprobs) + 1 > first)
        add(self, first, entries)

    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, prompt_logprobs=2)
    llm = LLM(str(folder), max_model_len=128, block_size=4, num_kv_blocks=32, max_num_batched_tokens=32)
    request.Request.add_prompt_logprobs = spy
    try:
        outs = llm.generate(prompts, params)
    finally:
        request.Request.add_prompt_logprobs = add
    assert any(recomputed)  # the case under test happened: a chunk came again after preemption
    check_against(prompts, outs, hf_log_softmax(folder, prompts), "float32", k=2)


def test_one_token_prompt_has_only_the_leading_none(llama):
    folder, _, _ = llama
    llm = LLM(str(folder), max_model_len=128, block_size=8, num_kv_blocks=64)
    out = llm.generate([[7]], SamplingParams(temperature=0, max_tokens=1, prompt_logprobs=2))[0]
    assert out.prompt_logprobs == [None]


@pytest.mark.parametrize("value", [-1, 21])
def test_bounds(value):
    with pytest.raises(InvalidRequestError, match="prompt_logprobs must be between 0 and 20") as e:
        SamplingParams(prompt_logprobs=value)
    assert e.value.param == "prompt_logprobs"


def test_request_keeps_each_position_once():
    from fdcli_engine.request import Request

    req = Request("r", list(range(10)), SamplingParams(prompt_logprobs=0), max_model_len=64)
    req.add_prompt_logprobs(1, [["a"], ["b"], ["c"]])
    req.add_prompt_logprobs(1, [["a"], ["b"]])  # recomputed after preemption
    req.add_prompt_logprobs(2, [["b"], ["c"], ["d"], ["e"]])
    assert req.take_prompt_logprobs() == [["a"], ["b"], ["c"], ["d"], ["e"]]
    assert req.take_prompt_logprobs() is None  # handed out once


SMOL_TEXTS = [
    "The capital of France is Paris.",
    "Question: What is 2 + 2?\nAnswer: 4",
    "def add(a, b):\n    return a + b",
]


@pytest.mark.slow
@pytest.mark.parametrize(
    "quantization, max_atol, mean_atol",
    [(None, 2e-4, 5e-5), ("gguf", 3e-2, 1e-2)],
    ids=["dequantized-fp32-cache", "gguf-blocks-bf16-cache"],
)
def test_smollm2_against_its_dequantized_transformers_model(smollm2_hf, quantization, max_atol, mean_atol):
    """The real SmolLM2 GGUF vs transformers' own GGUF loader (dequantized, fp32). Dequantized with the
    fp32 cache: observed at most 2.3e-5 (mean 7e-6); allowed 2e-4 and 5e-5. The default path (Q4_1 blocks
    multiplied as they are, 16-bit activations, bf16 cache; test_gguf_smollm2 states its logits error,
    2e-2): observed at most 0.013 (mean 0.0034); allowed 3e-2 and 1e-2. On the bf16 levels the prompt rows
    of the quantized linears multiply bf16 activations (test_amx.py): observed at most 0.038 (mean 0.010)
    on AMX, 0.055 (mean 0.012) on a Zen 4 (avx512bf16, vdpbf16ps, fp32 prompt attention); allowed 6e-2 and
    2e-2 there. The prompt token's rank-1 entry (the model's argmax) equals transformers' at every position
    on these prompts."""
    import torch
    from fd_kernels import native

    from fdcli_engine import ops

    if quantization == "gguf" and ops.describe() in {f"native ({isa})" for isa in native.BF16_PROMPT_ISAS}:
        max_atol, mean_atol = 6e-2, 2e-2

    hf = smollm2_hf
    llm = LLM(None, max_model_len=256, quantization=quantization)
    prompts = [llm.tokenizer.encode(t) for t in SMOL_TEXTS]
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=1, prompt_logprobs=1))
    diffs = []
    for p, out in zip(prompts, outs):
        with torch.no_grad():
            ref = torch.log_softmax(hf(torch.tensor([p])).logits[0].double(), -1).numpy()
        assert out.prompt_logprobs[0] is None and len(out.prompt_logprobs) == len(p)
        for pos in range(1, len(p)):
            entry = out.prompt_logprobs[pos]
            diffs.append(abs(entry[p[pos]].logprob - ref[pos - 1][p[pos]]))
            top1 = next(t for t, lp in entry.items() if lp.rank == 1)
            assert top1 == int(ref[pos - 1].argmax())
    assert max(diffs) <= max_atol and float(np.mean(diffs)) <= mean_atol, (max(diffs), np.mean(diffs))


@pytest.mark.parametrize("kind", ["CUMULATIVE", "DELTA", "FINAL_ONLY"])
def test_output_kinds_carry_them_as_vllm(kind, llama):
    """DELTA: only in the output they arrive with (and a merge of piled-up deltas keeps them); the
    other kinds: in every output once known."""
    import asyncio

    from fdcli_engine.api.request_stream import OutputCollector
    from fdcli_engine.config import EngineConfig
    from fdcli_engine.config_resolver import resolve_config
    from fdcli_engine.output_processor import OutputProcessor
    from fdcli_engine.outputs import EngineCoreOutput
    from fdcli_engine.sampling_params import RequestOutputKind
    from fdcli_engine.tokenizer import load_tokenizer

    folder, _, _ = llama
    tok = load_tokenizer(resolve_config(EngineConfig(model=str(folder))))
    output_kind = RequestOutputKind[kind]
    op = OutputProcessor(tok)
    op.add_request("r", None, [5, 6, 7], SamplingParams(prompt_logprobs=0, output_kind=output_kind))
    steps = [
        EngineCoreOutput("r", [9], prompt_logprobs=[[(6, -1.0, 3)], [(7, -2.0, 1)]]),
        EngineCoreOutput("r", [10]),
        EngineCoreOutput("r", [11], finish_reason="length"),
    ]
    outs = [o for s in steps for o in op.process_outputs([s])[0]]
    want = [None, {6: Logprob(6, -1.0, tok.decode([6]), 3)}, {7: Logprob(7, -2.0, tok.decode([7]), 1)}]
    if output_kind is RequestOutputKind.DELTA:
        assert [o.prompt_logprobs for o in outs] == [want, None, None]
        collector = OutputCollector(output_kind)
        for o in outs:
            collector.put_nowait(o)
        assert asyncio.run(collector.get()).prompt_logprobs == want
    else:
        assert outs and all(o.prompt_logprobs == want for o in outs)
