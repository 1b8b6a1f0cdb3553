"""Where a batch-1 decode step's time goes, in one process (`LLM.generate`, greedy, one request): wall-clock
spans around the engine's, runner's and model's calls, per step, plus the LM head alone against reading
its bytes once (`fd_kernels.native.read_bytes`) and the custom ops each step dispatches.

    OMP_NUM_THREADS=2 python benchmarks/profile_decode_step.py [--decode-len 128] [--passes 3]

Per span: mean ms per decode step over (a DECODE_LEN-token run - a 1-token run) / (DECODE_LEN - 1), so
the prompt step cancels. Spans nest (core.step > runner.execute > model.forward > decoder_stack ...);
`host` lines are a span minus the spans inside it. The spans' own cost (a few perf_counter calls per
wrapped call) is included, so the figures are upper bounds of the host parts.
"""

from __future__ import annotations

import argparse
import collections
import os
import time

os.environ.setdefault("OMP_NUM_THREADS", str(os.cpu_count() or 1))

from fdcli_engine.threads import set_omp_defaults  # noqa: E402

set_omp_defaults(bind=False)  # as bench_decode_roofline.py: KMP_BLOCKTIME=1, threads unbound

PROMPT_LEN = 32
SPANS = collections.defaultdict(float)
CALLS = collections.Counter()


def wrap(obj, name: str, key: str) -> None:
    """Replace obj.name by a wrapper that adds its wall time to SPANS[key]."""
    fn = getattr(obj, name)

    def timed(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            SPANS[key] += time.perf_counter() - t0
            CALLS[key] += 1

    setattr(obj, name, timed)


def instrument():
    from fd_kernels import native

    from fdcli_engine import ops
    from fdcli_engine.runner import model_runner

    core = _find(lambda o: type(o).__name__ == "EngineCore")
    runner = _find(lambda o: isinstance(o, model_runner.ModelRunner))
    wrap(core, "step", "core.step")
    wrap(core.scheduler, "schedule", "scheduler.schedule")
    wrap(core.scheduler, "update_from_output", "scheduler.update")
    wrap(runner, "execute", "runner.execute")
    wrap(model_runner, "build_inputs", "build_inputs")
    wrap(runner.model, "forward", "model.forward")
    wrap(ops, "embedding", "op.embedding")
    wrap(ops, "decoder_stack", "op.decoder_stack")
    if ops.decoder_stack_greedy is not None:  # the same op, ending with the LM head's argmax
        wrap(ops, "decoder_stack_greedy", "op.decoder_stack")
    wrap(runner, "_sample", "runner._sample")
    wrap(runner.model, "compute_logits", "compute_logits (LM head)")
    if runner._greedy_tokens is not None:  # plain greedy steps: LM head + argmax in one op
        wrap(runner, "_greedy_tokens", "greedy_tokens (LM head + argmax)")
    if runner._forward_greedy is not None:  # or with the forward: stack + LM head + argmax in one op
        wrap(runner, "_forward_greedy", "model.forward")
    wrap(runner.sampler, "sample", "sampler.sample")
    wrap(native, "_run", "custom ops dispatched")
    return runner


def _find(pred):
    import gc

    return next(o for o in gc.get_objects() if pred(o))


def lm_head_vs_read(runner, reads: int = 30) -> tuple[float, float, float, int]:
    """Best ms of the LM head alone on one row, of the LM head + argmax op, and of reading its packed
    bytes once."""
    import numpy as np
    import paddle
    from fd_kernels import native

    lw = runner.model.lm_head.lw
    nbytes = sum(int(np.prod(t.shape)) * t.element_size() for t in (lw.packed, lw.scales, lw.mins))
    buf = np.ones(nbytes, dtype=np.uint8)
    x = paddle.randn([1, lw.in_features], dtype="float32")

    def best(fn) -> float:
        ts = []
        for _ in range(reads):
            t0 = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t0)
        return min(ts) * 1e3

    head = best(lambda: runner.model.compute_logits(x))
    fused = best(lambda: runner.model.compute_greedy_tokens(x))
    return head, fused, best(lambda: native.read_bytes(buf)), nbytes


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--passes", type=int, default=3)
    ap.add_argument("--decode-len", type=int, default=128)
    args = ap.parse_args()

    from fdcli_engine import LLM, SamplingParams

    llm = LLM(None, max_model_len=1024)
    prompt = [100 + (i * 7919) % 30000 for i in range(PROMPT_LEN)]

    def generate(n: int) -> dict[str, float]:
        SPANS.clear()
        CALLS.clear()
        t0 = time.perf_counter()
        llm.generate([prompt], SamplingParams(temperature=0, max_tokens=n, ignore_eos=True))
        out = dict(SPANS)
        out["generate"] = time.perf_counter() - t0
        out["#custom ops dispatched"] = CALLS["custom ops dispatched"]
        return out

    runner = instrument()
    generate(4)  # warm-up
    steps = args.decode_len - 1
    for p in range(args.passes):
        one, long = generate(1), generate(args.decode_len)
        per = {k: (long[k] - one.get(k, 0.0)) / steps for k in long}
        print(f"pass {p}: per decode step (ms)")
        for k in sorted(per, key=lambda k: -per[k]):
            if k.startswith("#"):
                print(f"  {k:28s} {per[k]:8.2f}")
            else:
                print(f"  {k:28s} {per[k] * 1e3:8.4f}")
        host = {
            "host: generate - core.step": per["generate"] - per["core.step"],
            "host: core.step - execute - scheduler": per["core.step"]
            - per["runner.execute"]
            - per["scheduler.schedule"]
            - per["scheduler.update"],
            "host: execute - forward - _sample": per["runner.execute"]
            - per["model.forward"]
            - per["runner._sample"],
            "host: forward - stack op": per["model.forward"] - per.get("op.decoder_stack", 0.0),
            "host: _sample - LM head": per["runner._sample"]
            - per.get("compute_logits (LM head)", 0.0)
            - per.get("greedy_tokens (LM head + argmax)", 0.0),
        }
        for k, v in host.items():
            print(f"  {k:40s} {v * 1e3:8.4f}")
        head, fused, read, nbytes = lm_head_vs_read(runner)
        print(
            f"  LM head alone {head:.3f} ms (+ argmax op {fused:.3f} ms), read of its {nbytes / 1e6:.1f} MB"
            f" {read:.3f} ms: {head / read:.2f}x"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
