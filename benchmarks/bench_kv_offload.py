"""Time to first token of a long prompt whose prefix comes back from a KV offload tier, against
recomputing it (docs/kv-offload.md). SmolLM2 (the default model) unless --model is given.

    python benchmarks/bench_kv_offload.py [--prefix-len 2000] [--tail-len 16] [--repeats 3]

Modes, each on its own engine (one request at a time, --max-tokens 1, so the request's time is its TTFT):
- recompute: a fresh prefix every time, nothing to hit;
- pool: the prefix is still in the KV pool (the prefix cache's own hit, the lower bound);
- swap / swap-int8: the pool holds one request; another prompt evicts the prefix into the memory tier
  (--swap-space, raw or --kv-offload-compression int8), then the timed request loads it back;
- file: one engine computes the prefix and exits; a new engine with the same --kv-offload-dir loads it.
Prints each mode's median TTFT and its ratio to recompute (the issue's target: at most 0.2x).

`--codec` instead times the tiers' own work on a prefix's blocks, without a model: saving them (the copy
out of the pool, or int8 compression) and restoring them into the pool, int8 against the exact tier's
copy in the same run (SmolLM2's cache shape: --layers 30, --kv-heads 3, --head-dim 64).
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time


def prompt(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(100, 30000) for _ in range(n)]


def timed(llm, tokens: list[int], params) -> float:
    t = time.perf_counter()
    llm.generate([tokens], params)
    return time.perf_counter() - t


def engine(args, **options):
    from fdcli_engine import LLM

    total = args.prefix_len + args.tail_len + 8
    blocks = -(-total // 16) + 2  # one request's worth: the next prompt evicts the last one's blocks
    return LLM(args.model, max_model_len=total, num_kv_blocks=blocks, threads=args.threads, **options)


def run_mode(mode: str, args, params, rng: random.Random) -> list[float]:
    times = []
    for _ in range(args.repeats):
        prefix = prompt(rng, args.prefix_len)
        first, second = prefix + prompt(rng, args.tail_len), prefix + prompt(rng, args.tail_len)
        other = prompt(rng, args.prefix_len + args.tail_len)
        if mode == "recompute":
            llm = engine(args)
            llm.generate([other], params)  # warm-up of the same shape
            times.append(timed(llm, first, params))
        elif mode == "pool":
            llm = engine(args)
            llm.generate([first], params)
            times.append(timed(llm, second, params))
        elif mode.startswith("swap"):
            compression = "int8" if mode == "swap-int8" else None
            llm = engine(args, swap_space=args.swap_gb, kv_offload_compression=compression)
            llm.generate([first], params)
            llm.generate([other], params)  # evicts the prefix into the tier
            times.append(timed(llm, second, params))
            assert llm.get_stats()["kv_offload_hit_tokens"] > 0, "the tier was not hit"
        elif mode == "file":
            with tempfile.TemporaryDirectory() as d:
                llm = engine(args, kv_offload_dir=d)
                llm.generate([first], params)
                llm.engine.shutdown()  # writes every queued block
                llm = engine(args, kv_offload_dir=d)
                llm.generate([other], params)  # warm-up of the same shape, another prefix
                times.append(timed(llm, second, params))
                assert llm.get_stats()["kv_offload_hit_tokens"] > 0, "the file tier was not hit"
                llm.engine.shutdown()
    return times


def codec_ratios(args) -> None:
    import numpy as np

    from fdcli_engine import ops
    from fdcli_engine.kv_transfer.base import KVBlockViews
    from fdcli_engine.kv_transfer.offload.codec import BlockCodec

    ops.use()
    n = -(-args.prefix_len // 16)
    rng = np.random.default_rng(0)
    shape = (n, args.kv_heads, 16, args.head_dim)
    views = KVBlockViews([rng.standard_normal(shape, np.float32) for _ in range(2 * args.layers)], 16)
    best = {}
    for name, compression in (("exact", None), ("int8", "int8")):
        codec = BlockCodec(views, compression)
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            stored = [codec.encode_block(views, b) for b in range(n)]
            t1 = time.perf_counter()
            for b in range(n):
                codec.decode_into(stored[b], views, b)
            t2 = time.perf_counter()
            save, restore = best.get(name, (float("inf"),) * 2)
            best[name] = (min(save, t1 - t0), min(restore, t2 - t1))
    print(f"{n} blocks ({ops.describe()}), best of {args.repeats}, int8 time / exact time:")
    print(f"  save    {best['int8'][0] / best['exact'][0]:.2f}x")
    print(f"  restore {best['int8'][1] / best['exact'][1]:.2f}x")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="default: SmolLM2-135M, fd's default model")
    ap.add_argument("--prefix-len", type=int, default=2000)
    ap.add_argument("--tail-len", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--swap-gb", type=float, default=1.0)
    ap.add_argument("--modes", default="recompute,pool,swap,swap-int8,file")
    ap.add_argument("--codec", action="store_true", help="time only the tiers' save and restore")
    ap.add_argument("--layers", type=int, default=30)
    ap.add_argument("--kv-heads", type=int, default=3)
    ap.add_argument("--head-dim", type=int, default=64)
    args = ap.parse_args()
    if args.codec:
        codec_ratios(args)
        return

    from fdcli_engine import SamplingParams

    params = SamplingParams(temperature=0, max_tokens=1)
    rng = random.Random(0)
    results = {m: statistics.median(run_mode(m, args, params, rng)) for m in args.modes.split(",")}
    base = results.get("recompute")
    print(f"prefix {args.prefix_len} tokens + {args.tail_len}, median of {args.repeats}:")
    for mode, t in results.items():
        ratio = f"  {t / base:.3f}x recompute" if base else ""
        print(f"  {mode:10s} TTFT {t * 1000:9.1f} ms{ratio}")


if __name__ == "__main__":
    main()
