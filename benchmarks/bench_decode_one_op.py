"""A batch-1 greedy decode step as one custom op against three, alternated in one process (`LLM.generate`,
the default model, one request, ignore_eos):
- 3op: the embedding op (`fd_linear_rows`), the decoder stack, the LM head's argmax (`fd_linear_argmax`);
- 2op: the stack looks the token rows up itself, then the LM head's argmax op;
- 1op-after: the stack's op also ends with the LM head's argmax (`model.forward_greedy`), run after the
  decode region returns (FD_DECODE_REGION_HEAD=0: `fdk::linear_argmax`);
- 1op-dispatch: the same with the head's GEMM and argmax inside the decode region, the stack called
  through Paddle's custom-op dispatch (the ctypes entry of fd_kernels/native/stack_step.py read as absent);
- 1op: the same called through ctypes (the default).

    OMP_NUM_THREADS=2 python benchmarks/bench_decode_one_op.py [--decode-len 128] [--rounds 12]
        [--configs 3op,2op,1op-after,1op-dispatch,1op]

Per round and configuration: (a DECODE_LEN-token run - a 1-token run) / (DECODE_LEN - 1), the
configurations' order reversed every other round; the tokens must be the same in all of them, and the
region's head-step counter must say the head ran inside the region in `1op-dispatch` and `1op` only, and
the ctypes step counter that the step went through ctypes in `1op-after` and `1op` only.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("OMP_NUM_THREADS", str(os.cpu_count() or 1))

from fdcli_engine.threads import set_omp_defaults  # noqa: E402

set_omp_defaults(bind=False)  # as bench_decode_roofline.py: KMP_BLOCKTIME=1, threads unbound

CONFIGS = ("3op", "2op", "1op-after", "1op-dispatch", "1op")
IN_REGION = ("1op-dispatch", "1op")  # the LM head inside the decode region
THROUGH_CTYPES = ("1op-after", "1op")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--decode-len", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument(
        "--configs", default=",".join(CONFIGS), help="comma-separated, from " + ", ".join(CONFIGS)
    )
    args = ap.parse_args()
    configs = args.configs.split(",")
    if len(configs) < 2 or not set(configs) <= set(CONFIGS):
        raise SystemExit(f"--configs: two or more of {', '.join(CONFIGS)}")

    from fd_kernels import native
    from fd_kernels.native import stack_step

    from fdcli_engine import LLM, SamplingParams

    llm = LLM(None, max_model_len=1024)
    runner = llm.engine.runner
    stack, forward_greedy = runner.model.decoder_stack, runner._forward_greedy
    if stack is None or forward_greedy is None or not (stack.embeds_tokens and stack.has_head):
        raise SystemExit("the default model does not run the packed stack with its table and head here")
    entry = stack_step._bind()
    if not entry:
        raise SystemExit("the kernel library has no fd_decoder_stack_greedy_host")
    prompt = [100 + (i * 7919) % 30000 for i in range(32)]

    def generate(n: int) -> tuple[float, list[int]]:
        t0 = time.perf_counter()
        out = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=n, ignore_eos=True))
        return time.perf_counter() - t0, list(out[0].outputs[0].token_ids)

    def use(name: str) -> None:
        runner._forward_greedy = forward_greedy if name.startswith("1op") else None
        stack.embeds_tokens = name != "3op"
        os.environ["FD_DECODE_REGION_HEAD"] = "0" if name == "1op-after" else "1"
        stack_step._entry = False if name == "1op-dispatch" else entry

    steps: dict[str, list[float]] = {name: [] for name in configs}
    tokens: list[int] = []
    generate(4)  # warm-up
    for r in range(args.rounds):
        for name in configs if r % 2 == 0 else reversed(configs):
            use(name)
            before, ctypes_before = native.decode_region_head_steps(), stack_step.steps
            one, _ = generate(1)
            long, toks = generate(args.decode_len)
            if (native.decode_region_head_steps() > before) != (name in IN_REGION):
                raise SystemExit(
                    f"{name}: the head ran {'outside' if name in IN_REGION else 'inside'} the region"
                )
            if (stack_step.steps > ctypes_before) != (name in THROUGH_CTYPES):
                raise SystemExit(
                    f"{name}: the step {'did not go' if name in THROUGH_CTYPES else 'went'} through ctypes"
                )
            if tokens and toks != tokens:
                raise SystemExit(f"{name}: the tokens differ")
            tokens = toks
            steps[name].append((long - one) / (args.decode_len - 1) * 1e3)
    use("1op")
    os.environ.pop("FD_DECODE_REGION_HEAD")
    for name, v in steps.items():
        print(f"{name}: step {min(v):.3f}-{max(v):.3f} ms, median {statistics.median(v):.3f}")
    last = configs[-1]
    for name in configs[:-1]:
        diff = [a - b for a, b in zip(steps[last], steps[name], strict=True)]
        spread = f"({min(diff):+.3f} to {max(diff):+.3f})"
        print(f"{last} - {name} per round: median {statistics.median(diff):+.3f} ms {spread}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
