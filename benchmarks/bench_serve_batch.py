"""One batch of prompts sent at once, through `fd serve` and in process, alternated: TTFT, TPOT, tokens/s.

Issue #29's serving load at concurrency 16 is 16 random-token prompts of 512 tokens that arrive together
and stream 128 tokens each. Its TPOT is not the batch-16 decode step: with chunked prefill (2,048 tokens a
step) the prompts are prefilled four at a time, and the first ones already decode while the later ones
are still prefilled, so their TPOT holds part of those prefill steps. This script sends the same batch
to a real `fd serve` (streaming completions; TTFT and TPOT from the times the client saw each chunk)
and to the in-process engine (the same engine and output processor driven step by step; TTFT and TPOT
from the times each request's outputs came back), in turns, so the two sides' figures are the same
quantity and their difference is what the server adds (a pass's ratio compares two runs seconds apart;
on a shared machine only those ratios mean anything). It also prints CPU milliseconds per output token
of the server's front end, its engine core, the client (this process during server runs) and the
in-process engine (psutil: user + system time), which do not depend on what else the machine runs.

The in-process engine gets the engine-core process's OpenMP settings (KMP_BLOCKTIME=1, bound threads:
core_proc.build_core), so the two sides run the same compute.

    python benchmarks/bench_serve_batch.py [--num-prompts 16] [--prompt-len 512] [--output-len 128]
        [--passes 4] [--model PATH] [-- extra fd serve flags]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time

os.environ.setdefault("OMP_NUM_THREADS", str(os.cpu_count() or 1))
SERVER_ENV = dict(os.environ)  # the server's engine core picks its own OpenMP defaults (core_proc.py)
from fdcli_engine.threads import set_omp_defaults  # noqa: E402  (after SERVER_ENV: importing sets variables)

set_omp_defaults(bind=True)


async def _one_stream(url: str, ids: list[int], output_len: int) -> tuple[float, float]:
    """(TTFT, TPOT) seconds of one streamed completion, from the times its chunks arrived; the stream is
    checked as stream_client checks it (exact token count, finish_reason, [DONE], no error event)."""
    from stream_client import StreamError, _check_events

    from fdcli.bench import http1

    body = {"prompt": ids, "max_tokens": output_len, "ignore_eos": True, "temperature": 0}
    body.update(stream=True, return_token_ids=True)
    events, times = [], []
    t0 = time.perf_counter()
    async with http1.Pool() as pool, pool.stream("POST", url + "/v1/completions", json=body) as resp:
        if resp.status_code != 200:
            raise StreamError(f"server answered {resp.status_code}: {(await resp.aread())[:300]!r}")
        async for line in resp.aiter_lines():
            if line:
                events.append(line.encode())
                times.append(time.perf_counter())
    _check_events(b"\n\n".join(events) + b"\n\n", output_len)
    chunks = times[:-1]  # the last event is [DONE]
    return chunks[0] - t0, (chunks[-1] - chunks[0]) / max(1, output_len - 1)


async def run_server(url: str, prompts: list[list[int]], output_len: int) -> tuple[list, float]:
    t0 = time.perf_counter()
    res = await asyncio.gather(*(_one_stream(url, ids, output_len) for ids in prompts))
    return res, time.perf_counter() - t0


def run_in_process(llm, prompts: list[list[int]], output_len: int) -> tuple[list, float]:
    """The same batch on the engine and output processor, stepped here (no HTTP, no second process)."""
    from fdcli_engine.sampling_params import RequestOutputKind, SamplingParams

    params = SamplingParams(
        max_tokens=output_len, ignore_eos=True, temperature=0, output_kind=RequestOutputKind.DELTA
    )
    t0 = time.perf_counter()
    ids = [f"batch-{time.monotonic_ns()}-{i}" for i in range(len(prompts))]
    for rid, p in zip(ids, prompts):
        llm.add_request(rid, p, params)
    first: dict[str, float] = {}
    last: dict[str, float] = {}
    left = len(prompts)
    while left:
        outs, _ = llm.processor.process_outputs(llm.engine.step())
        now = time.perf_counter()
        for o in outs:
            first.setdefault(o.request_id, now)
            last[o.request_id] = now
            left -= o.finished
    res = [(first[r] - t0, (last[r] - first[r]) / max(1, output_len - 1)) for r in ids]
    return res, time.perf_counter() - t0


def _fmt(xs: list[float], unit: float = 1000.0) -> str:
    return f"{unit * min(xs):.1f}-{unit * max(xs):.1f} (median {unit * statistics.median(xs):.1f})"


def main() -> None:
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from bench_serve_overhead import _core_pid, cpu_s, make_prompts
    from stream_client import run as run_async
    from stream_client import start_fd_serve, stop_fd_serve

    argv = sys.argv[1:]
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--num-prompts", type=int, default=16)
    p.add_argument("--prompt-len", type=int, default=512)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--passes", type=int, default=4)
    p.add_argument("--model", default=None)
    args = p.parse_args(argv[: argv.index("--")] if "--" in argv else argv)
    serve_args = ["--no-enable-prefix-caching", *(["--model", args.model] if args.model else []), *extra]

    from fdcli_engine.api import LLM

    proc, url = start_fd_serve(serve_args, SERVER_ENV)
    try:
        core_pid = _core_pid(proc.pid)
        llm = LLM(args.model, enable_prefix_caching=False)
        run_async(run_server(url, make_prompts(2, 64, 1), 4))  # warm-up
        run_in_process(llm, make_prompts(2, 64, 1), 4)
        figs: dict[str, dict[str, list[float]]] = {
            s: {"ttft": [], "tpot": [], "tok_s": []} for s in ("server", "engine")
        }
        cpu = {"front_end": 0.0, "core": 0.0, "client": 0.0, "engine": 0.0}
        tokens = args.num_prompts * args.output_len
        for i in range(args.passes):
            for side in ("server", "engine") if i % 2 == 0 else ("engine", "server"):
                prompts = make_prompts(args.num_prompts, args.prompt_len, 1000 * i + (side == "engine"))
                before = (cpu_s(proc.pid), cpu_s(core_pid), cpu_s())
                if side == "server":
                    res, wall = run_async(run_server(url, prompts, args.output_len))
                else:
                    res, wall = run_in_process(llm, prompts, args.output_len)
                after = (cpu_s(proc.pid), cpu_s(core_pid), cpu_s())
                if side == "server":
                    for k, j in (("front_end", 0), ("core", 1), ("client", 2)):
                        cpu[k] += after[j] - before[j]
                else:
                    cpu["engine"] += after[2] - before[2]
                f = figs[side]
                f["ttft"].append(statistics.mean(r[0] for r in res))
                f["tpot"].append(statistics.mean(r[1] for r in res))
                f["tok_s"].append(tokens / wall)
                print(
                    f"pass {i} {side}: TTFT {1000 * f['ttft'][-1]:.1f} ms, TPOT {1000 * f['tpot'][-1]:.2f} ms, "
                    f"{f['tok_s'][-1]:.1f} tok/s",
                    file=sys.stderr,
                    flush=True,
                )
    finally:
        stop_fd_serve(proc)
    for side, f in figs.items():
        print(
            f"{side:>7}: mean TTFT ms {_fmt(f['ttft'])}, mean TPOT ms {_fmt(f['tpot'])}, "
            f"output tok/s {_fmt(f['tok_s'], 1.0)}"
        )
    ratios = [s / e for s, e in zip(figs["server"]["tok_s"], figs["engine"]["tok_s"])]
    print(
        f"tok/s server / in-process per pass: {', '.join(f'{r:.3f}' for r in ratios)} "
        f"(median {statistics.median(ratios):.3f})"
    )
    per_tok = {k: 1000 * v / (tokens * args.passes) for k, v in cpu.items()}
    print("CPU ms per output token: " + ", ".join(f"{k} {v:.3f}" for k, v in per_tok.items()))


if __name__ == "__main__":
    main()
