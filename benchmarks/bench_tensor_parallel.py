"""Tensor parallelism at concurrency 1: time per output token of `--tensor-parallel-size 2` (two ranks of
one thread each, each on its own CPU) against TP=1 with two threads and with one, on the same CPUs.

    python benchmarks/bench_tensor_parallel.py [--output-len 64] [--prompt-len 32] [--repeats 3]
        [--layers 30] [--quantization wint8] [--model PATH]

The default model is a random Llama with SmolLM2-135M's shape except for its heads (8 query / 4 KV heads
of 64, since SmolLM2's 3 KV heads do not divide by 2): hidden 576, intermediate 1536, vocab 49152,
built once under the temp dir. Each setting runs in its own process (the offline engine, greedy,
ignore_eos); time per output token = (time of 1 + N tokens - time of 1 token) / N, the median of the
repeats. Prints each setting's ms/token and the ratios to TP=1 with two threads. On a 2-core machine TP=2
has no more cores than TP=1, so the ratio measures what the split costs (two all-reduces per layer, the
step's inputs sent to the worker) against what it saves (each rank reads half the weights);
docs/parallel.md, "Tensor parallel", says how this scales on a 2-socket server.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SHAPE = dict(
    hidden_size=576,
    intermediate_size=1536,
    num_attention_heads=8,
    num_key_value_heads=4,
    vocab_size=49152,
    max_position_embeddings=2048,
    tie_word_embeddings=True,
    rms_norm_eps=1e-5,
)


def build_model(layers: int) -> Path:
    folder = Path(tempfile.gettempdir()) / f"fd-bench-tp-llama-{layers}"
    if (folder / "config.json").exists():
        return folder
    import torch
    import transformers

    torch.manual_seed(0)
    config = transformers.LlamaConfig(num_hidden_layers=layers, **SHAPE)
    model = transformers.LlamaForCausalLM(config).eval()
    model.save_pretrained(folder)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from tiny_models import write_tiny_tokenizer

    write_tiny_tokenizer(folder)
    return folder


def child(spec: dict) -> dict:
    from fdcli_engine import LLM, SamplingParams

    llm = LLM(spec["model"], max_model_len=512, **spec["options"])
    prompt = {"prompt_token_ids": [(13 * i) % 250 + 3 for i in range(spec["prompt_len"])]}

    def timed(n: int) -> float:
        t = time.perf_counter()
        llm.generate([prompt], SamplingParams(temperature=0, max_tokens=n, ignore_eos=True))
        return time.perf_counter() - t

    try:
        timed(4)  # warm-up: first-call allocations
        n = spec["output_len"]
        tpot = [(timed(1 + n) - timed(1)) / n for _ in range(spec["repeats"])]
    finally:
        llm.engine.shutdown()
    return {"tpot_ms": 1000 * statistics.median(tpot), "all_ms": [round(1000 * x, 2) for x in tpot]}


def run_setting(spec: dict) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": str(spec["options"].get("threads") or 1)}
    r = subprocess.run(
        [sys.executable, __file__, "--child", json.dumps(spec)], capture_output=True, text=True, env=env
    )
    if r.returncode != 0:
        raise SystemExit(f"setting {spec['options']} failed:\n{r.stderr[-2000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--output-len", type=int, default=64)
    p.add_argument("--prompt-len", type=int, default=32)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--layers", type=int, default=30)
    p.add_argument("--quantization", default=None)
    p.add_argument("--model", default=None)
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print(json.dumps(child(json.loads(args.child))))
        return
    model = args.model or str(build_model(args.layers))
    base = {
        "model": model,
        "prompt_len": args.prompt_len,
        "output_len": args.output_len,
        "repeats": args.repeats,
    }
    quant = {"quantization": args.quantization} if args.quantization else {}
    settings = {
        "TP=1, 2 threads": {"threads": 2, **quant},
        "TP=1, 1 thread": {"threads": 1, **quant},
        "TP=2, 1 thread each": {"tensor_parallel_size": 2, **quant},
    }
    results = {}
    for name, options in settings.items():
        results[name] = run_setting({**base, "options": options})
        print(f"{name:22s} {results[name]['tpot_ms']:8.2f} ms/token  {results[name]['all_ms']}", flush=True)
    ref = results["TP=1, 2 threads"]["tpot_ms"]
    for name in ("TP=1, 1 thread", "TP=2, 1 thread each"):
        print(f"{name} / TP=1 2 threads: {results[name]['tpot_ms'] / ref:.2f}x time per token")


if __name__ == "__main__":
    main()
