"""Time to first token of one prompt through `fd serve` against the same prompt in process, alternated.

Each pass sends one random-token prompt (512 tokens by default, max_tokens=1, prefix caching off on both
sides) to a real `fd serve` (streaming completions through stream_client.py's raw HTTP client, the whole
stream read) and another to an in-process `LLM.generate`, in turns (the order flips every pass), with a
pause between requests so neither side's OpenMP threads still spin while the other runs. Prints both
sides' times as ranges and medians and the median of the per-pass ratios (server / in-process; 1.0 = the
server adds nothing).

--engine-env picks the in-process engine's OpenMP settings: `serve` (the default) gives it the engine-core
process's (KMP_BLOCKTIME=1, threads bound: core_proc.build_core), so the ratio is what the server adds;
`plain` leaves OpenMP's defaults (200 ms block time, no binding), as a bare `LLM` in a script runs.

    python benchmarks/bench_serve_ttft.py [--prompt-len 512] [--passes 16] [--engine-env serve|plain]
        [--model PATH] [-- extra fd serve flags]
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time

os.environ.setdefault("OMP_NUM_THREADS", str(os.cpu_count() or 1))
SERVER_ENV = dict(os.environ)  # the server's engine core picks its own OpenMP defaults (core_proc.py)
if "--engine-env" not in sys.argv or sys.argv[sys.argv.index("--engine-env") + 1 :][:1] != ["plain"]:
    from fdcli_engine.threads import set_omp_defaults  # after SERVER_ENV: importing sets variables

    set_omp_defaults(bind=True)

PAUSE_S = 0.3  # longer than any OpenMP block time in play, so the other side's threads sleep


async def serve_once(url: str, ids: list[int]) -> float:
    """Seconds from sending the request to the end of its (one-token) stream."""
    from stream_client import stream_completion

    body = {"prompt": ids, "max_tokens": 1, "ignore_eos": True, "stream": True, "return_token_ids": True}
    t0 = time.perf_counter()
    await stream_completion(url, "/v1/completions", body, expected_tokens=1)
    return time.perf_counter() - t0


def engine_once(llm, ids: list[int]) -> float:
    from fdcli_engine.sampling_params import SamplingParams

    params = SamplingParams(max_tokens=1, ignore_eos=True)
    t0 = time.perf_counter()
    out = llm.generate([{"prompt_token_ids": ids}], params, use_tqdm=False)
    dt = time.perf_counter() - t0
    if len(out[0].outputs[0].token_ids) != 1:
        raise SystemExit("the in-process engine did not return one token")
    return dt


def _range(xs: list[float]) -> str:
    return f"{1000 * min(xs):.1f}-{1000 * max(xs):.1f} ms (median {1000 * statistics.median(xs):.1f})"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default=None)
    p.add_argument("--prompt-len", type=int, default=512)
    p.add_argument("--passes", type=int, default=16)
    p.add_argument("--engine-env", choices=["serve", "plain"], default="serve")
    p.add_argument("--max-token-id", type=int, default=40000, help="below the model's vocabulary")
    p.add_argument("serve_args", nargs="*", help="extra fd serve flags (after --)")
    args = p.parse_args()
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from stream_client import run, start_fd_serve, stop_fd_serve

    from fdcli_engine.api import LLM

    rng = random.Random(0)

    def prompt() -> list[int]:
        return [rng.randrange(100, args.max_token_id) for _ in range(args.prompt_len)]

    model = ["--model", args.model] if args.model else []
    proc, url = start_fd_serve(["--no-enable-prefix-caching", *model, *args.serve_args], SERVER_ENV)
    try:
        llm = LLM(args.model, enable_prefix_caching=False)
        cpus = os.sched_getaffinity(0)
        times: dict[str, list[float]] = {"server": [], "engine": []}
        ratios = []
        for i in range(args.passes + 1):  # pass 0 warms both sides up and is not counted
            dt = {}
            for side in ("server", "engine") if i % 2 else ("engine", "server"):
                time.sleep(PAUSE_S)
                os.sched_setaffinity(0, cpus)  # the in-process binding pinned this thread
                dt[side] = run(serve_once(url, prompt())) if side == "server" else engine_once(llm, prompt())
            if i:
                for side, s in dt.items():
                    times[side].append(s)
                ratios.append(dt["server"] / dt["engine"])
        print(f"prompt {args.prompt_len} tokens, {args.passes} passes, in-process env {args.engine_env}")
        print(f"  fd serve:   {_range(times['server'])}")
        print(f"  in-process: {_range(times['engine'])}")
        print(
            f"  server / in-process per pass: {min(ratios):.3f}-{max(ratios):.3f} (median "
            f"{statistics.median(ratios):.3f}); median gap "
            f"{1000 * (statistics.median(times['server']) - statistics.median(times['engine'])):.1f} ms"
        )
    finally:
        stop_fd_serve(proc)


if __name__ == "__main__":
    main()
