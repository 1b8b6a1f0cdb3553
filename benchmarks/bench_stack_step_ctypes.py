"""The batch-1 greedy decode step with its stack call through ctypes against the same step through Paddle's
custom op (`fd_decoder_stack`), alternated in one process on the default model:

    OMP_NUM_THREADS=2 python benchmarks/bench_stack_step_ctypes.py [--passes 5] [--decode-len 128]

Step time: (a run of DECODE_LEN tokens - a run of 1 token) / (DECODE_LEN - 1), greedy, one request
(`LLM.generate`), as bench_decode_roofline.py measures it. The op path is the ctypes entry read as absent
(fd_kernels/native/stack_step.py), so both paths run the same kernels on the same engine; the generated
tokens of the two paths are checked equal. The machine is shared: every pass is printed, and ranges.
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("OMP_NUM_THREADS", str(os.cpu_count() or 1))
from fdcli_engine.threads import set_omp_defaults  # noqa: E402  (as bench_decode_roofline.py)

set_omp_defaults(bind=False)

PROMPT_LEN = 32


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--passes", type=int, default=5)
    ap.add_argument("--decode-len", type=int, default=128)
    args = ap.parse_args()

    from fd_kernels.native import stack_step

    from fdcli_engine import LLM, SamplingParams

    llm = LLM(None, max_model_len=1024)
    prompt = [100 + (i * 7919) % 30000 for i in range(PROMPT_LEN)]
    bound = stack_step._bind()
    if not bound:
        raise SystemExit("the kernel library has no fd_decoder_stack_greedy_host")

    def generate(n: int, through_ctypes: bool) -> tuple[float, list[int]]:
        stack_step._entry = bound if through_ctypes else False
        params = SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)
        t0 = time.perf_counter()
        out = llm.generate([prompt], params)
        return time.perf_counter() - t0, out[0].outputs[0].token_ids

    def step(through_ctypes: bool) -> tuple[float, list[int]]:
        t_long, ids = generate(args.decode_len, through_ctypes)
        t_one = min(generate(1, through_ctypes)[0], generate(1, through_ctypes)[0])
        return (t_long - t_one) / (args.decode_len - 1), ids

    generate(4, True), generate(4, False)  # warm-up
    steps: dict[bool, list[float]] = {False: [], True: []}
    for p in range(args.passes):
        (op, want), (ct, got) = step(False), step(True)
        if got != want:
            raise SystemExit("the ctypes step's tokens differ from the op's")
        steps[False].append(op)
        steps[True].append(ct)
        print(
            f"pass {p}: op {op * 1e3:.3f} ms, ctypes {ct * 1e3:.3f} ms, op - ctypes {(op - ct) * 1e6:.1f} us"
        )
    stack_step._entry = bound
    for mode, name in ((False, "op    "), (True, "ctypes")):
        xs = steps[mode]
        print(f"decode step, {name}  {min(xs) * 1e3:.3f}-{max(xs) * 1e3:.3f} ms")
    diffs = [a - b for a, b in zip(steps[False], steps[True])]
    print(f"op - ctypes per pass  {min(diffs) * 1e6:.1f}-{max(diffs) * 1e6:.1f} us")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
