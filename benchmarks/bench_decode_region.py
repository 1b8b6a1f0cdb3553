"""The decoder stack's pure-decode step in one parallel region (csrc/decode_region.cc) against the per-op
loop, alternated in one process: FD_DECODE_REGION=0 turns the region off between runs.

    OMP_NUM_THREADS=2 python benchmarks/bench_decode_region.py [--rounds 8] [--decode-len 64]
        [--batch 1] [--prompt-len 32]

Step time: (a run of DECODE_LEN tokens - a 1-token run) / (DECODE_LEN - 1), greedy, BATCH requests of
PROMPT_LEN tokens each (so contexts PROMPT_LEN..PROMPT_LEN + DECODE_LEN), on the default model
(`LLM.generate`); e.g. issue #29's c16 load is `--batch 16 --prompt-len 512 --decode-len 128`. Each round times both paths, in alternating order; the machine is shared,
so the minimum and the median over rounds are printed for each.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

os.environ.setdefault("OMP_NUM_THREADS", str(os.cpu_count() or 1))
os.environ.setdefault("KMP_BLOCKTIME", "1")  # as the engine core sets it (bench_decode_roofline.py)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--decode-len", type=int, default=64)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--prompt-len", type=int, default=32)
    args = ap.parse_args()

    from fd_kernels import native

    from fdcli_engine import LLM, SamplingParams

    llm = LLM(None, max_model_len=max(1024, args.prompt_len + args.decode_len))
    prompts = [
        [100 + (i * 7919 + b * 104729) % 30000 for i in range(args.prompt_len)] for b in range(args.batch)
    ]

    def run(n: int) -> float:
        params = SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)
        t0 = time.perf_counter()
        llm.generate(prompts, params)
        return time.perf_counter() - t0

    def step(region: bool) -> float:
        os.environ["FD_DECODE_REGION"] = "1" if region else "0"
        return (run(args.decode_len) - run(1)) / (args.decode_len - 1)

    step(True), step(False)  # warm-up
    before = native.decode_region_steps()
    times: dict[bool, list[float]] = {True: [], False: []}
    for r in range(args.rounds):
        for region in (r % 2 == 0, r % 2 != 0):
            times[region].append(step(region))
    assert native.decode_region_steps() > before, "the region never ran: not a GGUF model?"
    for region, name in ((False, "per-op loop"), (True, "one region ")):
        xs = times[region]
        print(f"{name}  step min {min(xs) * 1e3:.3f} ms  median {statistics.median(xs) * 1e3:.3f} ms")
    ratio = [a / b for a, b in zip(times[True], times[False], strict=True)]
    print(
        f"region / per-op per round: {min(ratio):.3f}-{max(ratio):.3f}, median {statistics.median(ratio):.3f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
