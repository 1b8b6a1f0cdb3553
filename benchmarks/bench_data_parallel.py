"""Data parallelism's throughput: `fd serve --data-parallel-size 2` (two engine cores of one thread each,
each pinned to its own CPU) against `--data-parallel-size 1` (one engine core of two threads), the same
CPUs, the same closed loop (bench_serve_overhead.run_server: streaming completions, ignore_eos), one
server of each loaded at once and measured in turns that alternate between repeats.

    python benchmarks/bench_data_parallel.py [--concurrency 16] [--requests 64] [--prompt-len 128]
        [--output-len 128] [--repeats 3] [--model PATH]   (default model: SmolLM2)

Prints each setting's median output tokens/s and the DP=2 / DP=1 ratio. On a 2-core machine both settings
use the same two cores, so the ratio says what splitting one engine's threads into two engines costs or
buys (fewer threads per barrier against two front-end-side streams of work); on a 2-socket server each
rank gets a NUMA node's cores and memory (docs/parallel.md, "Data parallel").
"""

from __future__ import annotations

import argparse
import statistics
import sys

import bench_serve_overhead as overhead
from stream_client import run as run_async

from fdcli_engine.threads import usable_cpu_count


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--requests", type=int, default=64)
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--model", default=None)
    args = p.parse_args()
    cpus = usable_cpu_count()
    common = ["--max-num-seqs", str(args.concurrency)]
    settings = {
        f"DP=1 ({cpus} threads)": [*common, "--data-parallel-size", "1", "--threads", str(cpus)],
        f"DP=2 ({cpus // 2} thread(s) each)": [*common, "--data-parallel-size", "2"],
    }
    servers = {}
    tok_s: dict[str, list[float]] = {name: [] for name in settings}
    try:
        for name, engine_args in settings.items():
            servers[name] = overhead.start_server(args.model, engine_args)
        names = list(settings)
        for r in range(args.repeats):
            prompts = overhead.make_prompts(args.requests, args.prompt_len, 4200 + r)
            for name in names if r % 2 == 0 else names[::-1]:
                url = servers[name][1]
                tok_s[name].append(
                    run_async(overhead.run_server(url, prompts, args.output_len, args.concurrency))[0]
                )
                print(name, "repeat", r, round(tok_s[name][-1], 1), file=sys.stderr, flush=True)
    finally:
        for proc, _ in servers.values():
            proc.terminate()
            proc.wait(60)
    medians = {name: statistics.median(v) for name, v in tok_s.items()}
    print(f"concurrency {args.concurrency}, {args.requests} requests x {args.output_len} output tokens")
    for name, med in medians.items():
        print(f"{name:>24}: {med:8.1f} output tok/s")
    dp1, dp2 = medians.values()
    print(f"DP=2 / DP=1 output throughput: {dp2 / dp1:.3f}x")


if __name__ == "__main__":
    main()
