"""Time of a serving step that mixes prompts with generated tokens, against a step of prompts alone, same run.

A server rarely gets a burst of requests at one instant: the first one starts decoding while the rest
arrive, so their prefill runs in a step that also carries its generated token. That step should cost
about what the same prompts cost alone. Each repeat times, on the in-process engine (SmolLM2 by default):
  mixed: one request prefilled alone, then N-1 new prompts in the next step together with its token;
  pure:  N new prompts in one step.
and prints the medians and the ratio mixed / pure (about (N-1)/N when the mix costs nothing extra).

    python benchmarks/bench_mixed_step.py [--requests 16] [--prompt-len 128] [--repeats 4] [--threads 2]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

from bench_decode_stack import prompts


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=4)
    ap.add_argument("--threads", type=int, default=None, help="kernel threads (default: the engine's)")
    ap.add_argument("--model", default=None)
    args = ap.parse_args()
    from fdcli_engine import LLM, SamplingParams
    from fdcli_engine.engine import EngineCoreRequest

    llm = LLM(args.model, threads=args.threads)
    core = llm.engine
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    llm.generate(prompts(2, 8, 0), params)  # warm-up

    def add(tag: str, batch: list[list[int]]) -> None:
        for i, p in enumerate(batch):
            core.add_request(EngineCoreRequest(f"{tag}-{i}", p, params, time.time()))

    def timed_step() -> float:
        t0 = time.perf_counter()
        core.step()
        return time.perf_counter() - t0

    def drain() -> None:
        while core.has_unfinished_requests():
            core.step()

    mixed, pure = [], []
    n, length = args.requests, args.prompt_len
    for rep in range(args.repeats):
        core.reset_prefix_cache()  # every repeat computes its prefill
        batch = prompts(n, length, 100 + rep)
        add(f"m{rep}a", batch[:1])
        core.step()
        add(f"m{rep}b", batch[1:])
        mixed.append(timed_step())
        drain()
        add(f"p{rep}", prompts(n, length, 200 + rep))
        pure.append(timed_step())
        drain()
    m, p = statistics.median(mixed), statistics.median(pure)
    print(
        f"{n - 1} prompts + 1 generated token: {m * 1e3:8.1f} ms  (runs: {[round(x * 1e3) for x in mixed]})"
    )
    print(f"{n} prompts alone:               {p * 1e3:8.1f} ms  (runs: {[round(x * 1e3) for x in pure]})")
    print(f"ratio mixed / pure: {m / p:.3f}  (prompt tokens {((n - 1) / n):.3f} of the pure step's)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
