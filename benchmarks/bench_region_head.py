"""A batch-1 greedy decode step with the LM head inside the decode region against after it, alternated in
one process (`LLM.generate`, the default model, one request, ignore_eos): FD_DECODE_REGION_HEAD=0 runs the
head's GEMM and argmax after the region returns (`fdk::linear_argmax`), =1 inside it.

    OMP_NUM_THREADS=2 python benchmarks/bench_region_head.py [--decode-len 128] [--rounds 12]

Per round and configuration: (a DECODE_LEN-token run - a 1-token run) / (DECODE_LEN - 1), the
configurations' order reversed every other round; the tokens must be the same in both.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("OMP_NUM_THREADS", str(os.cpu_count() or 1))

from fdcli_engine.threads import set_omp_defaults  # noqa: E402

set_omp_defaults(bind=False)  # as bench_decode_roofline.py: KMP_BLOCKTIME=1, threads unbound

CONFIGS = ("after", "inside")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--decode-len", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=12)
    args = ap.parse_args()

    from fd_kernels import native

    from fdcli_engine import LLM, SamplingParams

    llm = LLM(None, max_model_len=1024)
    prompt = [100 + (i * 7919) % 30000 for i in range(32)]

    def generate(n: int) -> tuple[float, list[int]]:
        t0 = time.perf_counter()
        out = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=n, ignore_eos=True))
        return time.perf_counter() - t0, list(out[0].outputs[0].token_ids)

    steps: dict[str, list[float]] = {name: [] for name in CONFIGS}
    tokens: list[int] = []
    generate(4)  # warm-up
    for r in range(args.rounds):
        for name in CONFIGS if r % 2 == 0 else reversed(CONFIGS):
            os.environ["FD_DECODE_REGION_HEAD"] = "1" if name == "inside" else "0"
            before = native.decode_region_head_steps()
            one, _ = generate(1)
            long, toks = generate(args.decode_len)
            ran = native.decode_region_head_steps() - before
            if (ran > 0) != (name == "inside"):
                raise SystemExit(f"{name}: {ran} steps ran the head in the region")
            if tokens and toks != tokens:
                raise SystemExit(f"{name}: the tokens differ")
            tokens = toks
            steps[name].append((long - one) / (args.decode_len - 1) * 1e3)
    os.environ.pop("FD_DECODE_REGION_HEAD")
    for name, v in steps.items():
        print(f"{name}: step {min(v):.3f}-{max(v):.3f} ms, median {statistics.median(v):.3f}")
    diff = [a - b for a, b in zip(steps["inside"], steps["after"], strict=True)]
    print(
        f"inside - after per round: median {statistics.median(diff):+.3f} ms ({min(diff):+.3f} to {max(diff):+.3f})"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
