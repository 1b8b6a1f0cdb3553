"""Decode steps with the weights and KV cache on 2 MB pages against 4 KB pages, alternated in one process.

    OMP_NUM_THREADS=2 python benchmarks/bench_huge_pages.py [--rounds 20] [--decode-len 32] [--batch 1]
        [--prompt-len 32]

Two engines on the default model in one process: one built with FD_HUGEPAGES=0 (small pages), one with
the default (runner/huge_pages.py collapses its weights and caches after load). Each round runs both
engines, in alternating order: BATCH requests of PROMPT_LEN tokens each, DECODE_LEN tokens greedy.
Per decode step the model's forward plus its LM head (`compute_logits`) is timed alone (prompt steps
are left out), and per run the step as (DECODE_LEN-token run - 1-token run) / (DECODE_LEN - 1). The
machine is shared and load from other processes only adds time, so the minimum and the 10th percentile
of the per-step times, and the lower quartile of the per-run step, are printed.
Also prints the bytes each engine has on huge pages (its ModelRunner's count).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

os.environ.setdefault("OMP_NUM_THREADS", str(os.cpu_count() or 1))
os.environ.setdefault("KMP_BLOCKTIME", "1")  # as the engine core sets it (bench_decode_roofline.py)


def timed_steps(model, sink: list[float], batch: int, last: dict) -> None:
    """Append the wall time of each decode step's forward + compute_logits of `model` to `sink`: steps
    of at most `batch` tokens (a prompt's steps have more). `last` keeps the last decode step's calls
    (forward's and compute_logits' arguments) for `replay`."""
    forward, logits = model.forward, model.compute_logits
    start = [0.0, 0]

    def fwd(input_ids, *args, **kwargs):
        start[:] = [time.perf_counter(), int(input_ids.shape[0])]
        if start[1] <= batch:
            last["forward"] = (input_ids, *args), kwargs
        return forward(input_ids, *args, **kwargs)

    def head(*args, **kwargs):
        out = logits(*args, **kwargs)
        if start[1] <= batch:
            sink.append(time.perf_counter() - start[0])
            last["head"] = args, kwargs
        return out

    last["call"] = forward, logits
    model.forward, model.compute_logits = fwd, head


def replay(last: dict) -> float:
    """Run the last decode step's forward and LM head again (it rewrites the same KV slots with the same
    values); returns its seconds."""
    forward, logits = last["call"]
    (fa, fk), (ha, hk) = last["forward"], last["head"]
    t0 = time.perf_counter()
    forward(*fa, **fk)
    logits(*ha, **hk)
    return time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--decode-len", type=int, default=32)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--replays", type=int, default=300, help="alternated replays of the last decode step")
    ap.add_argument("--kv-cache-memory-gb", type=float, default=0.5)
    args = ap.parse_args()

    from fdcli_engine import LLM, SamplingParams

    options = dict(
        max_model_len=max(1024, args.prompt_len + args.decode_len),
        kv_cache_memory_gb=args.kv_cache_memory_gb,
    )
    engines, sinks, lasts = {}, {}, {}
    for name, flag in (("4k", "0"), ("2m", "1")):
        os.environ["FD_HUGEPAGES"] = flag
        engines[name] = LLM(None, **options)
        sinks[name], lasts[name] = [], {}
        timed_steps(engines[name].engine.runner.model, sinks[name], args.batch, lasts[name])
        print(f"{name}: {engines[name].engine.runner.huge_page_bytes / 2**20:.0f} MiB on huge pages")
    prompts = [
        [100 + (i * 7919 + b * 104729) % 30000 for i in range(args.prompt_len)] for b in range(args.batch)
    ]

    def run(name: str, n: int, keep: bool) -> float:
        params = SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)
        sink = sinks[name]
        mark = len(sink)
        t0 = time.perf_counter()
        engines[name].generate(prompts, params)
        elapsed = time.perf_counter() - t0
        if not keep:
            del sink[mark:]
        return elapsed

    def step(name: str) -> float:
        return (run(name, args.decode_len, True) - run(name, 1, False)) / (args.decode_len - 1)

    for name in engines:
        step(name)  # warm-up
        sinks[name].clear()
    runs: dict[str, list[float]] = {"4k": [], "2m": []}
    for r in range(args.rounds):
        for name in ("4k", "2m") if r % 2 == 0 else ("2m", "4k"):
            runs[name].append(step(name))
    for name in engines:
        s = sorted(sinks[name])
        q1 = statistics.quantiles(runs[name], n=4)[0]
        print(
            f"{name}: forward+head per step min {s[0] * 1e3:.3f} ms, p10 {s[len(s) // 10] * 1e3:.3f} ms "
            f"({len(s)} steps); run step lower quartile {q1 * 1e3:.3f} ms"
        )
    a, b = sorted(sinks["4k"]), sorted(sinks["2m"])
    print(f"2m / 4k forward+head: min {b[0] / a[0]:.3f}, p10 {b[len(b) // 10] / a[len(a) // 10]:.3f}")
    if args.replays < 2:
        return 0
    pairs = []
    for i in range(args.replays):
        order = ("4k", "2m") if i % 2 == 0 else ("2m", "4k")
        t = {name: replay(lasts[name]) for name in order}
        pairs.append((t["4k"], t["2m"]))
    ratios = sorted(b / a for a, b in pairs)
    a, b = sorted(p[0] for p in pairs), sorted(p[1] for p in pairs)
    print(
        f"replayed step: 4k min {a[0] * 1e3:.3f} / median {a[len(a) // 2] * 1e3:.3f} ms, 2m min "
        f"{b[0] * 1e3:.3f} / median {b[len(b) // 2] * 1e3:.3f} ms; 2m / 4k per pair: quartiles "
        f"{ratios[len(ratios) // 4]:.3f} {ratios[len(ratios) // 2]:.3f} {ratios[3 * len(ratios) // 4]:.3f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
