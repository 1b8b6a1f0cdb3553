"""Decode time per step on SmolLM2-135M (Q4_1 GGUF), fused decoder stack against the per-op layer loop and
KV cache dtype against KV cache dtype, in one process so all see the same machine load (one engine per
cache dtype; their runs take turns).

For each KV cache dtype and batch size (1 and 16 requests of PROMPT_LEN prompt tokens, 32 by default: the
context decode attention reads) it times a run of DECODE_LEN tokens and a 1-token run and divides the
difference by DECODE_LEN - 1 steps: prefill cancels out. Reports wall clock
and `time.process_time()` (CPU seconds of this process: a load-robust proxy on a shared machine when
one thread: --threads 1, the default).

    python benchmarks/bench_decode_stack.py [--repeats 3] [--decode-len 64] [--prompt-len 32] [--threads 1]
        [--kv-cache-dtype float32,bfloat16,int8] [--paths per-op,stack]
"""

from __future__ import annotations

import argparse
import random
import sys
import time


def prompts(n: int, length: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(100, 40000) for _ in range(length)] for _ in range(n)]


def timed(fn) -> tuple[float, float]:
    w0, c0 = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - w0, time.process_time() - c0


def run_fn(llm, batch, n: int):
    from fdcli_engine import SamplingParams

    def run():
        llm.engine.reset_prefix_cache()
        llm.generate(batch, SamplingParams(temperature=0, max_tokens=n, ignore_eos=True))

    return run


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--decode-len", type=int, default=64)
    ap.add_argument("--prompt-len", type=int, default=32, help="prompt tokens per request: the context")
    ap.add_argument(
        "--kv-cache-dtype", default="float32", help="comma-separated: one engine each, runs interleaved"
    )
    ap.add_argument("--kv-cache-memory-gb", type=float, default=1.0, help="per engine")
    ap.add_argument("--paths", default="per-op,stack", help="comma-separated: per-op, stack")
    ap.add_argument("--quantization", default="gguf")
    ap.add_argument("--threads", type=int, default=1, help="kernel threads (the engine's --threads)")
    args = ap.parse_args()
    from fdcli_engine import LLM, SamplingParams

    dtypes = args.kv_cache_dtype.split(",")
    llms = {}
    for dtype in dtypes:
        llms[dtype] = LLM(
            None,
            max_model_len=max(1024, args.prompt_len + args.decode_len),
            quantization=args.quantization,
            kv_cache_dtype=dtype,
            kv_cache_memory_gb=args.kv_cache_memory_gb,
            max_num_batched_tokens=1024,
            threads=args.threads,
        )
        llms[dtype].generate(prompts(2, 8, 0), SamplingParams(max_tokens=4))  # warm-up
    print(f"threads={args.threads} prompt_len={args.prompt_len} decode_len={args.decode_len}")
    print(
        f"{'kv cache':<10}{'path':<8}{'batch':>6}{'wall ms/step':>14}{'cpu ms/step':>13}"
        f"{'tok/s wall':>12}{'tok/s cpu':>11}"
    )
    for batch_size, seed in ((1, 1), (16, 2)):
        batch = prompts(batch_size, args.prompt_len, seed)
        for name in args.paths.split(","):
            runs = [
                d for d in dtypes if name != "stack" or getattr(llms[d].engine.model, "decoder_stack", None)
            ]
            # Best of `repeats` for the long and the 1-token run of each engine, the engines taking turns
            # within each repeat so that all see the same machine load; prefill cancels out.
            long: dict[str, list] = {d: [] for d in runs}
            one: dict[str, list] = {d: [] for d in runs}
            for _ in range(args.repeats):
                for d in runs:
                    llms[d].engine.model.use_decoder_stack = name == "stack"
                    long[d].append(timed(run_fn(llms[d], batch, args.decode_len)))
                    one[d].append(timed(run_fn(llms[d], batch, 1)))
            steps = args.decode_len - 1
            for d in runs:
                wall = (min(t[0] for t in long[d]) - min(t[0] for t in one[d])) / steps
                cpu = (min(t[1] for t in long[d]) - min(t[1] for t in one[d])) / steps
                print(
                    f"{d:<10}{name:<8}{batch_size:>6}{wall * 1e3:14.2f}{cpu * 1e3:13.2f}"
                    f"{batch_size / wall:12.1f}{batch_size / cpu:11.1f}",
                    flush=True,
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
