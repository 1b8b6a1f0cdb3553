"""`--tensor-parallel-size 2` end to end: the engine's rank 0 and one worker process (1 thread each)
against the same engine with TP=1, on tiny random checkpoints (tests/tiny_models.py).

References and tolerances:
- fp32 models: greedy tokens equal, and the top-5 log-probabilities of every generated token within
  LOGPROB_TOL nats of TP=1's (a log-softmax of the logits: the partial sums of the row-parallel layers
  run in another order, nothing else differs; measured differences are ~1e-6).
- wint8, and ERNIE-MoE's wint4 with expert parallel: each rank holds exactly the codes of the unsharded
  weight, so the same bound holds (asserted). GGUF Q8_0: the same blocks, but the kernels quantize
  activations per block in fixed point, which moves log-probabilities by ~1e-4; a greedy answer may
  leave TP=1's only at a near-tie (NEAR_TIE_NATS, tests/engine/test_engine_smollm2.py's bound).
- Prefix caching, chunked prefill and preemption (a KV pool far too small) change what each step
  holds, never a token: TP=2 equals TP=1 under them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import tiny_models

from fdcli_engine import LLM
from fdcli_engine.errors import ConfigError

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "ernie"))
from ernie_archs import MOE, OVERRIDES  # noqa: E402

LOGPROB_TOL = 1e-4
NEAR_TIE_NATS = 0.05
GREEDY = dict(temperature=0, max_tokens=12, logprobs=5, ignore_eos=True)
HERE = Path(__file__).resolve().parent
PROMPTS = [[5, 6, 7, 8, 9, 10], [100, 3, 250, 17], [42] * 20 + [7, 300]]
ARCHS = {
    "llama": ("LlamaForCausalLM", {}),
    "qwen2": ("Qwen2ForCausalLM", {}),
    "qwen3": ("Qwen3ForCausalLM", {}),
    "ernie": ("Ernie4_5ForCausalLM", OVERRIDES["Ernie4_5ForCausalLM"]),
    "ernie-moe": (MOE, OVERRIDES[MOE]),
}


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    cache: dict[str, Path] = {}

    def build(name: str) -> Path:
        if name not in cache:
            arch, overrides = ARCHS[name]
            folder = tmp_path_factory.mktemp(name)
            tiny_models.make_tiny_checkpoint(arch, folder, **overrides)
            tiny_models.write_tiny_tokenizer(folder)
            cache[name] = folder
        return cache[name]

    return build


def generate(model, prompts=PROMPTS, params=GREEDY, **options):
    """(outputs, engine stats) of `prompts` (token ids) from a fresh offline engine in its own process
    (tp_generate.py): each output {"token_ids", "logprobs": [{token: logprob}] per token}."""
    spec = {
        "model": str(model),
        "options": {"max_model_len": 128, **options},
        "prompts": prompts,
        "params": params,
    }
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, str(HERE / "tp_generate.py"), json.dumps(spec)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    return result["outputs"], result["stats"]


def assert_same_logprobs(want, got):
    for a, b in zip(want, got, strict=True):
        assert b["token_ids"] == a["token_ids"]
        for pos, (la, lb) in enumerate(zip(a["logprobs"], b["logprobs"], strict=True)):
            assert set(la) == set(lb), pos
            for tok in la:
                assert abs(la[tok] - lb[tok]) <= LOGPROB_TOL, (pos, tok, la[tok], lb[tok])


def assert_equal_but_near_ties(want, got):
    for a, b in zip(want, got, strict=True):
        pairs = zip(a["token_ids"], b["token_ids"], strict=True)
        first = next((i for i, (x, y) in enumerate(pairs) if x != y), None)
        if first is not None:
            top2 = sorted(a["logprobs"][first].values(), reverse=True)
            assert top2[0] - top2[1] < NEAR_TIE_NATS, (first, a["logprobs"][first])


@pytest.mark.parametrize("name", list(ARCHS))
def test_tp2_equals_tp1(checkpoint, name):
    folder = checkpoint(name)
    want, _ = generate(folder)
    got, _ = generate(folder, tensor_parallel_size=2)
    assert_same_logprobs(want, got)


def test_expert_parallel_equals_tp1(checkpoint):
    folder = checkpoint("ernie-moe")
    want, _ = generate(folder)
    got, _ = generate(folder, tensor_parallel_size=2, enable_expert_parallel=True)
    assert_same_logprobs(want, got)


def test_wint8_tp2_equals_tp1(checkpoint):
    folder = checkpoint("llama")
    want, _ = generate(folder, quantization="wint8")
    got, _ = generate(folder, quantization="wint8", tensor_parallel_size=2)
    assert_same_logprobs(want, got)


def test_ernie_moe_wint4_expert_parallel_equals_tp1(checkpoint):
    """FastDeploy's wint4 for ERNIE MoE: experts 4-bit (whole experts per rank: the same groups), every
    other linear 8-bit (row-parallel shards keep their rows' scales)."""
    folder = checkpoint("ernie-moe")
    want, _ = generate(folder, quantization="wint4")
    got, _ = generate(folder, quantization="wint4", tensor_parallel_size=2, enable_expert_parallel=True)
    assert_same_logprobs(want, got)


@pytest.mark.parametrize("dtype", ["int8", "bfloat16"])
def test_kv_cache_dtypes_tp2_equal_tp1(checkpoint, dtype):
    """Each rank's cache holds its KV heads; the C8 cache's scales are per (block, head, slot), so a
    head's codes are the same on its rank as in the whole cache. Rounding K/V makes near-ties possible."""
    folder = checkpoint("qwen3")
    want, _ = generate(folder, kv_cache_dtype=dtype)
    got, _ = generate(folder, kv_cache_dtype=dtype, tensor_parallel_size=2)
    assert_equal_but_near_ties(want, got)


def test_gguf_blocks_tp2_equal_tp1(checkpoint, tmp_path):
    folder = checkpoint("llama")
    gguf = tiny_models.make_tiny_gguf(folder, tmp_path / "tiny-q8.gguf", "Q8_0")
    options = dict(tokenizer=str(folder), quantization="gguf")
    want, _ = generate(gguf, **options)
    got, _ = generate(gguf, tensor_parallel_size=2, **options)
    assert_equal_but_near_ties(want, got)


def test_prefix_caching_chunked_prefill_and_preemption(checkpoint):
    """16 requests sharing a 40-token prefix, prompts prefilled in 16-token chunks, and 40 blocks of 4
    tokens for requests that need far more: preemptions and prefix hits on both runs, the same tokens."""
    folder = checkpoint("qwen2")
    prefix = [(7 * i) % 500 + 3 for i in range(40)]
    prompts = [prefix + [10 + i, 20 + i] for i in range(16)]
    params = dict(temperature=0, max_tokens=24, ignore_eos=True)
    options = dict(
        block_size=4,
        num_kv_blocks=40,
        max_num_seqs=16,
        max_num_batched_tokens=16,
        enable_chunked_prefill=True,
        enable_prefix_caching=True,
    )
    want, s1 = generate(folder, prompts, params, **options)
    got, s2 = generate(folder, prompts, params, tensor_parallel_size=2, **options)
    assert [g["token_ids"] for g in got] == [w["token_ids"] for w in want]
    for stats in (s1, s2):
        assert stats["num_preemptions"] > 0 and stats["prefix_cache_hits"] > 0


def test_kv_heads_that_do_not_divide_refused_before_loading(tmp_path):
    folder = tiny_models.make_tiny_checkpoint(
        "LlamaForCausalLM", tmp_path, num_attention_heads=6, num_key_value_heads=3, hidden_size=48
    )
    with pytest.raises(ConfigError, match="^3 KV heads do not divide by tensor-parallel size 2$"):
        LLM(str(folder), tensor_parallel_size=2)


NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 2, "disable_by_batch_size": 64}


def test_ngram_speculation_structured_outputs_and_prompt_logprobs(checkpoint):
    """What only rank 0 does (drafts, grammar masks, sampling) and an LM head over prompt rows give the
    same tokens and log-probabilities at TP=2."""
    folder = checkpoint("llama")
    params = [
        dict(temperature=0, max_tokens=40, structured_outputs={"regex": r"(ab|cd){2,6}-[0-9]{3}"}),
        dict(temperature=0, max_tokens=20, structured_outputs={"choice": ["alpha beta", "alpha gamma"]}),
        dict(temperature=0, max_tokens=16, logprobs=3, prompt_logprobs=3, ignore_eos=True),
        dict(temperature=1.0, seed=5, max_tokens=16, ignore_eos=True),
    ]
    prompts = [[40, 41, 42, 43, 40, 41, 42]] * 3 + [[9, 8, 7, 9, 8, 7]]
    options = dict(speculative_config=NGRAM)
    want, _ = generate(folder, prompts, params, **options)
    got, stats = generate(folder, prompts, params, tensor_parallel_size=2, **options)
    assert [g["token_ids"] for g in got] == [w["token_ids"] for w in want]
    assert stats["spec_decode_num_draft_tokens_total"] > 0
    assert_same_logprobs(want[2:3], got[2:3])
    for a, b in zip(want[2]["prompt_logprobs"][1:], got[2]["prompt_logprobs"][1:], strict=True):
        assert set(a) == set(b) and all(abs(a[t] - b[t]) <= LOGPROB_TOL for t in a)


def test_draft_model_speculation_refused(checkpoint):
    folder = checkpoint("llama")
    spec = {"method": "draft_model", "model": str(folder), "num_speculative_tokens": 2}
    with pytest.raises(ConfigError, match="does not run with --tensor-parallel-size 2"):
        LLM(str(folder), tensor_parallel_size=2, speculative_config=spec)


KILL_WORKER_MID_GENERATE = """
import sys, psutil
from fdcli_engine import LLM, SamplingParams
llm = LLM(sys.argv[1], max_model_len=256, tensor_parallel_size=2)
(worker,) = [c for c in psutil.Process().children() if "tp_worker" in " ".join(c.cmdline())]
execute, steps = llm.engine.runner.execute, []

def execute_then_kill(so):  # the worker dies after the third step, mid-generation
    steps.append(1)
    if len(steps) == 3:
        worker.kill()
    return execute(so)

llm.engine.runner.execute = execute_then_kill
try:
    llm.generate([{"prompt_token_ids": [5, 6, 7]}] * 4, SamplingParams(max_tokens=240, ignore_eos=True))
except Exception as e:
    print("ERROR", type(e).__name__, e)
    try:
        llm.generate([{"prompt_token_ids": [5]}], SamplingParams(max_tokens=2))
    except Exception as e2:
        print("AGAIN", type(e2).__name__, e2)
"""


def test_killed_worker_fails_the_offline_engine(checkpoint):
    """The in-process engine: generate() raises the worker's death instead of hanging, and so does
    every later call."""
    proc = subprocess.run(
        [sys.executable, "-c", KILL_WORKER_MID_GENERATE, str(checkpoint("llama"))],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    lines = [x for x in proc.stdout.splitlines() if x.startswith(("ERROR", "AGAIN"))]
    assert len(lines) == 2, proc.stdout + proc.stderr[-2000:]
    for line in lines:
        assert "TensorParallelError tensor-parallel rank 1" in line and "killed by signal 9" in line


WORKER_THAT_CANNOT_START = """
import sys
from fdcli_engine.runner import tp_executor
from fdcli_engine import LLM
tp_executor.WORKER_MODULE = "fd_no_such_worker_module"  # the worker's python exits with code 1
try:
    LLM(sys.argv[1], max_model_len=128, tensor_parallel_size=2)
except Exception as e:
    print("ERROR", type(e).__name__, e)
"""


def test_worker_that_cannot_start_fails_the_start_before_the_group_timeout(checkpoint):
    proc = subprocess.run(
        [sys.executable, "-c", WORKER_THAT_CANNOT_START, str(checkpoint("llama"))],
        capture_output=True,
        text=True,
        timeout=120,
    )
    lines = [x for x in proc.stdout.splitlines() if x.startswith("ERROR")]
    assert lines, proc.stdout + proc.stderr[-2000:]
    assert lines[0].startswith("ERROR TensorParallelError tensor-parallel rank 1")
    assert lines[0].endswith("exited with code 1 before joining the group")
