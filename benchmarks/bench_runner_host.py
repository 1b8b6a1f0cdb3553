"""Host time per decode step of the model runner: `ModelRunner.execute` minus the time inside the
decoder-stack and LM-head ops (so the runner's Python, input building, embedding lookup, sampler), on the
default model (SmolLM2 GGUF), greedy, in one process. Two runner paths take turns in blocks of steps on
the same engine, so both see the same machine load:

- `reuse`: the runner as it is (input tensors refilled in place, plain greedy batches argmaxed without
  the sampling op);
- `fresh`: new input tensors every step and every batch through the sampling op.

    OMP_NUM_THREADS=2 python benchmarks/bench_runner_host.py [--batch 1,16] [--blocks 5] [--steps 40]

Prints the median host time and median execute time of each block, as ranges over blocks, and checks
that both paths produced the same tokens.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

os.environ.setdefault("OMP_NUM_THREADS", str(os.cpu_count() or 1))

from fdcli_engine.threads import set_omp_defaults  # noqa: E402

set_omp_defaults(bind=False)  # KMP_BLOCKTIME=1 as the engine core sets it; threads left unbound


class KernelClock:
    """Seconds spent inside the named ops since the last reset (the ops module's names, wrapped)."""

    def __init__(self, ops, names):
        self.seconds = 0.0
        for name in names:
            setattr(ops, name, self._timed(getattr(ops, name)))

    def _timed(self, fn):
        def call(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - t0

        return call


def run_block(llm, prompts, steps: int, clock: KernelClock) -> tuple[float, float, list]:
    """(median host s, median execute s) over the block's decode steps, and the tokens."""
    import numpy as np

    from fdcli_engine import SamplingParams

    runner = llm.engine.runner
    execute = runner.execute
    host, total = [], []

    def timed(so):
        clock.seconds = 0.0
        t0 = time.perf_counter()
        out = execute(so)
        dt = time.perf_counter() - t0
        if so.scheduled and all(len(s.token_ids) == 1 for s in so.scheduled):
            host.append(dt - clock.seconds)
            total.append(dt)
        return out

    runner.execute = timed
    try:
        outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=steps + 1, ignore_eos=True))
    finally:
        del runner.execute
    return float(np.median(host)), float(np.median(total)), [o.outputs[0].token_ids for o in outs]


def use_path(llm, name: str, buffers, plain_greedy) -> None:
    from fdcli_engine.runner import sampler

    llm.engine.runner.input_buffers = buffers if name == "reuse" else None
    sampler._is_plain_greedy = plain_greedy if name == "reuse" else (lambda sr, eos_ids: False)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", default="1,16", help="comma-separated batch sizes")
    ap.add_argument("--blocks", type=int, default=5, help="blocks per path and batch size")
    ap.add_argument("--steps", type=int, default=40, help="decode steps per block")
    args = ap.parse_args()

    from fdcli_engine import LLM, ops
    from fdcli_engine.runner import sampler

    llm = LLM(None, max_model_len=1024)
    clock = KernelClock(ops, ("decoder_stack", "linear"))
    buffers, plain_greedy = llm.engine.runner.input_buffers, sampler._is_plain_greedy
    print(f"kernels: {ops.describe()}, threads {os.environ['OMP_NUM_THREADS']}")
    for batch in (int(b) for b in args.batch.split(",")):
        prompts = [[100 + (i * 7919 + 13 * r) % 30000 for i in range(32)] for r in range(batch)]
        results: dict[str, list] = {"reuse": [], "fresh": []}
        tokens = None
        for block in range(2 * args.blocks):
            name = ("fresh", "reuse")[block % 2]
            use_path(llm, name, buffers, plain_greedy)
            h, t, toks = run_block(llm, prompts, args.steps, clock)
            if tokens is not None and toks != tokens:
                print(f"batch {batch}: the {name} path produced other tokens", file=sys.stderr)
                return 1
            tokens = toks
            results[name].append((h, t))
        use_path(llm, "reuse", buffers, plain_greedy)
        for name, rows in results.items():
            hs, ts = [r[0] * 1e3 for r in rows], [r[1] * 1e3 for r in rows]
            print(
                f"batch {batch:3d} {name:6s} host {min(hs):.3f}-{max(hs):.3f} ms/step, "
                f"execute {min(ts):.3f}-{max(ts):.3f} ms/step"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
