"""What `fd serve`'s front-end priority (FD_FRONTEND_PRIORITY) costs and buys, measured in one run; any
other variable of the server's environment with --variable (e.g. FD_CPU_OMP_THREADS_BIND --values auto,nobind).

One server per setting is loaded at once, and each is measured in turn (for throughput, in an order that
alternates between repeats), so a change in the machine's load hits all alike:
- admission: while one stream decodes alone, 15 short requests (32-token prompts, 2 output tokens) are
  sent at once; the time until all are answered (median over --bursts). A front end that yields to the
  engine's threads answers late, because those threads are runnable through every step;
- throughput: bench_serve_overhead's closed loop (128-token prompts, 128 output tokens, ignore_eos) at
  each --concurrency; the median output tokens/s of each setting over --repeats, and its ratio to the
  first setting's.

    python benchmarks/bench_frontend_priority.py [--values normal,10,idle] [--variable FD_FRONTEND_PRIORITY]
        [--concurrency 1,4,16] [--repeats 3] [--bursts 4] [--model PATH]

Servers loaded later ran faster here (docs/bench.md, "Load order"): run it again with the values reversed.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time

import bench_serve_overhead as overhead
from stream_client import run as run_async
from stream_client import stream_completion


async def burst_ms(url: str, bursts: int) -> list[float]:
    """Times (ms) for 15 short requests sent together to be answered while one long stream decodes."""
    done = asyncio.Event()

    async def background() -> None:
        k = 0
        while not done.is_set():
            k += 1
            prompt = overhead.make_prompts(1, 64, 7000 + k)[0]
            body = {
                "prompt": prompt,
                "max_tokens": 600,
                "ignore_eos": True,
                "stream": True,
                "return_token_ids": True,
            }
            await stream_completion(url, "/v1/completions", body)

    task = asyncio.create_task(background())
    times = []
    try:
        for k in range(bursts):
            await asyncio.sleep(1.0)  # the background stream is decoding alone by now
            t0 = time.perf_counter()
            bodies = [
                {"prompt": p, "max_tokens": 2, "stream": True, "return_token_ids": True}
                for p in overhead.make_prompts(15, 32, 500 + k)
            ]
            await asyncio.gather(
                *(stream_completion(url, "/v1/completions", b, expected_tokens=2) for b in bodies)
            )
            times.append(1000 * (time.perf_counter() - t0))
    finally:
        done.set()
        await task  # its stream ends within 600 tokens; cancelling it would leave the server a dead client
    return times


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument(
        "--values", default="normal,10,idle", help="one server per value (a value named twice: A/A)"
    )
    p.add_argument("--variable", default="FD_FRONTEND_PRIORITY")
    p.add_argument("--concurrency", default="1,4,16")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--bursts", type=int, default=4)
    p.add_argument("--model", default=None)
    args = p.parse_args()
    values = args.values.split(",")
    names = [f"{v}#{i}" if values.count(v) > 1 else v for i, v in enumerate(values)]
    concs = [int(x) for x in args.concurrency.split(",")]
    servers = {}
    try:
        for name, value in zip(names, values):
            overhead.SERVER_ENV = dict(os.environ, **{args.variable: value})
            servers[name] = overhead.start_server(args.model, ["--max-num-seqs", "16"])
        admission = {name: run_async(burst_ms(url, args.bursts)) for name, (_, url) in servers.items()}
        tok_s = {(name, c): [] for name in names for c in concs}
        for c in concs:
            for r in range(args.repeats):
                prompts = overhead.make_prompts(16 if c == 1 else 32, 128, 9000 + 100 * c + r)
                for name in names if r % 2 == 0 else names[::-1]:
                    tok_s[name, c].append(
                        run_async(overhead.run_server(servers[name][1], prompts, 128, c))[0]
                    )
                    print(name, c, round(tok_s[name, c][-1], 1), file=sys.stderr, flush=True)
    finally:
        for proc, _ in servers.values():
            proc.terminate()
            proc.wait(60)

    base = names[0]
    print(
        f"{'value':>9} {'admission ms':>13}"
        + "".join(f" {'c' + str(c) + ' tok/s (ratio)':>20}" for c in concs)
    )
    for name in names:
        row = f"{name:>9} {statistics.median(admission[name]):>13.0f}"
        for c in concs:
            med = statistics.median(tok_s[name, c])
            row += f" {med:>11.1f} ({med / statistics.median(tok_s[base, c]):.3f})"
        print(row)


if __name__ == "__main__":
    main()
