"""Overhead of `fd serve` over the in-process engine, same load, same batch sizes.

Load (the issue's): N streaming completion requests with random-token prompts of 128 and 512 tokens,
128 output tokens each (ignore_eos), kept at concurrency 1, 4 and 16 (closed loop: a finished request
is replaced at once). The server run goes through HTTP + SSE + the engine-core process; the in-process
run drives `fdcli_engine.api.LLM`'s engine and output processor with the same closed loop. Prints output
tokens/s of both (medians) and the ratio (server / in-process; 1.0 = no overhead).

Load order: a process loaded later ran faster here. Three identical servers (bench_frontend_priority.py
--values normal,normal,normal, started one after another) served 1.00 / 1.02 / 1.09 at concurrency 1
and 1.00 / 1.20 / 1.29 at 16, in the order they were loaded. So whichever side is loaded second would win.
The benchmark runs in two halves: first the server is loaded before the in-process engine, then a new server
is started after it; each half runs --repeats alternated pairs of every load. The ratio is the geometric
mean of the two halves' median ratios; both halves and the range of all pairs are printed too.

It also prints CPU milliseconds per output token of each process (user + system time over the run, from
psutil): the server's front end (HTTP, SSE, detokenization), its engine core, this benchmark as the
HTTP client, and the in-process engine. Unlike tok/s these do not depend on what else the machine runs,
so they say where the server's overhead goes even on a busy machine.

The HTTP client is stream_client.py (raw asyncio connection, msgspec), not httpx: it shares the cores with
the server, and httpx alone cost about as much CPU per token as the server's front end. It still parses and
checks every stream (exact token count, finish_reason, [DONE], no error event).

CPU placement: the in-process engine pins its OpenMP threads as the server's engine core does
(FD_CPU_OMP_THREADS_BIND, default auto), so the two sides run the same compute and differ only by the server.
The HTTP client must share the CPUs with the server: by default (--client-cpus any) the OS places it;
--client-cpus front-end keeps it on the CPU the server gives its own front end (measured slower: the two
then queue behind each other).

    python benchmarks/bench_serve_overhead.py [--model PATH] [--num-requests 32] [--output-len 128]
        [--prompt-lens 128,512] [--concurrency 1,4,16] [--kv-cache-dtype auto|float32|bfloat16|int8]
        [--client-cpus any|front-end] [--repeats 1] [--json out.json]

Both runs share the machine's cores: run it when nothing else is busy.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import statistics
import subprocess
import sys
import time

os.environ.setdefault("OMP_NUM_THREADS", str(os.cpu_count() or 1))
SERVER_ENV = dict(os.environ)  # the server's engine core picks its own OpenMP defaults (core_proc.py)
# It sets KMP_BLOCKTIME=1 and binds its OpenMP threads; the in-process engine here gets the same settings,
# so the two sides differ only by the server.
from fdcli_engine.threads import set_omp_defaults  # noqa: E402  (after SERVER_ENV: importing sets variables)

set_omp_defaults(bind=True)


MAX_TOKEN_ID = 40000  # below SmolLM2's vocabulary (49152); --max-token-id for smaller models


def make_prompts(n: int, length: int, seed: int, max_token_id: int = MAX_TOKEN_ID) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(100, max_token_id) for _ in range(length)] for _ in range(n)]


def cpu_s(pid: int | None = None) -> float:
    """User + system CPU seconds of a process (this one when pid is None), all its threads."""
    import psutil

    t = psutil.Process(pid).cpu_times()
    return t.user + t.system


def run_in_process(llm, prompts, output_len: int, concurrency: int) -> tuple[float, int]:
    """(output tokens/s, tokens) of a closed loop of `concurrency` requests over the engine, no HTTP."""
    from fdcli_engine.sampling_params import SamplingParams

    params = SamplingParams(max_tokens=output_len, ignore_eos=True, temperature=0)
    pending = list(enumerate(prompts))
    tokens, inflight = 0, 0
    t0 = time.perf_counter()
    while pending or inflight:
        while pending and inflight < concurrency:
            i, ids = pending.pop(0)
            llm.add_request(f"bench-{time.monotonic_ns()}-{i}", ids, params)
            inflight += 1
        outs, to_abort = llm.processor.process_outputs(llm.engine.step())
        for o in outs:
            tokens += len(o.outputs[0].delta_token_ids)
            inflight -= o.finished
    return tokens / (time.perf_counter() - t0), tokens


async def run_server(url: str, prompts, output_len: int, concurrency: int) -> tuple[float, int]:
    """(output tokens/s, tokens) of the same closed loop through `fd serve` (streaming completions).
    Every stream is checked (stream_client.py): exactly `output_len` tokens, a finish_reason, [DONE]."""
    from stream_client import stream_completion

    sem = asyncio.Semaphore(concurrency)
    tokens = 0

    async def one(ids):
        nonlocal tokens
        body = {
            "prompt": ids,
            "max_tokens": output_len,
            "ignore_eos": True,
            "temperature": 0,
            "stream": True,
            "return_token_ids": True,
        }
        async with sem:
            n = await stream_completion(url, "/v1/completions", body, expected_tokens=output_len)
            tokens += n  # after the await: `tokens += await ...` would read `tokens` before it

    t0 = time.perf_counter()
    await asyncio.gather(*(one(ids) for ids in prompts))
    return tokens / (time.perf_counter() - t0), tokens


def start_server(model: str | None, engine_args: list[str]) -> tuple[subprocess.Popen, str]:
    from stream_client import start_fd_serve

    return start_fd_serve([*engine_args, *(["--model", model] if model else [])], SERVER_ENV)


def _core_pid(server_pid: int) -> int:
    """The engine-core process: the server's one child that runs fdcli_engine.api.core_proc."""
    import psutil

    for child in psutil.Process(server_pid).children(recursive=True):
        if "fdcli_engine.api.core_proc" in " ".join(child.cmdline()):
            return child.pid
    raise SystemExit("cannot find the server's engine-core process")


def _placement(num_threads: int, client: str) -> tuple[set[int], set[int]]:
    """CPUs of this process's main thread while it drives the in-process engine (the CPU its OpenMP binding
    gave it) and while it is the server's HTTP client (--client-cpus)."""
    from fdcli_engine.threads import BIND_ENV, allowed_cpus, bind_plan

    cpus = set(allowed_cpus())
    plan = bind_plan(num_threads, os.environ.get(BIND_ENV), allowed_cpus())
    if plan is None:
        return cpus, cpus
    return {plan[0][0]}, set(plan[1]) if client == "front-end" else cpus


class Sides:
    """The server (restartable) and the in-process engine, and the CPU placement of this process."""

    def __init__(self, args):
        from fdcli_engine.api import LLM

        self.args = args
        self.engine_args = ["--max-num-seqs", str(args.max_num_seqs), "--kv-cache-dtype", args.kv_cache_dtype]
        self.proc = None
        self.start_server()
        self.llm = LLM(args.model, max_num_seqs=args.max_num_seqs, kv_cache_dtype=args.kv_cache_dtype)
        self.engine_cpus, self.client_cpus = _placement(self.llm.config.num_threads, args.client_cpus)

    def start_server(self) -> None:
        self.stop_server()
        self.proc, self.url = start_server(self.args.model, self.engine_args)
        self.core_pid = _core_pid(self.proc.pid)

    def stop_server(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(60)
            self.proc = None

    def measure(self, side: str, prompts, concurrency: int, cpu: dict) -> tuple[float, int]:
        """One run of one side: (tok/s, tokens); adds each process's CPU seconds to `cpu`."""
        from stream_client import run as run_async

        before = (cpu_s(self.proc.pid), cpu_s(self.core_pid), cpu_s())
        os.sched_setaffinity(0, self.client_cpus if side == "server" else self.engine_cpus)
        if side == "server":
            tok_s, n = run_async(run_server(self.url, prompts, self.args.output_len, concurrency))
            measured = {"front_end": 0, "core": 1, "client": 2}
        else:
            tok_s, n = run_in_process(self.llm, prompts, self.args.output_len, concurrency)
            measured = {"engine": 2}  # this process, like the client
        after = (cpu_s(self.proc.pid), cpu_s(self.core_pid), cpu_s())
        for key, i in measured.items():
            cpu[key] += after[i] - before[i]
        return tok_s, n

    def warm_up(self, prompts) -> None:
        from stream_client import run as run_async

        run_async(run_server(self.url, prompts, 4, 1))
        run_in_process(self.llm, prompts, 4, 1)


def measure_half(sides: Sides, loads, half: int, results: dict) -> None:
    """--repeats alternated pairs of every load; results[(length, c)] collects the runs of both halves."""
    args = sides.args
    for length, c in loads:
        res = results.setdefault(
            (length, c),
            {
                "pairs": ([], []),  # server / in-process of each pair, per half
                "server": [],
                "engine": [],
                "tokens": {"server": 0, "engine": 0},
                "cpu": {"front_end": 0.0, "core": 0.0, "client": 0.0, "engine": 0.0},
            },
        )
        # Fresh prompts for every repeat (and none shared with the warm-up): both sides cache prefixes,
        # and a prompt seen before would skip its prefill.
        seed = length * 100 + c + 10_000 * half
        sets = [
            make_prompts(args.num_requests, length, seed + 1000 * r, args.max_token_id)
            for r in range(args.repeats + 1)
        ]
        sides.warm_up(sets.pop()[:1])
        tok_s = {}
        for r in range(args.repeats):
            for side in ("server", "engine") if r % 2 == 0 else ("engine", "server"):
                tok_s[side], n = sides.measure(side, sets[r], c, res["cpu"])
                res[side].append(tok_s[side])
                res["tokens"][side] += n
            res["pairs"][half].append(tok_s["server"] / tok_s["engine"])
            print(f"half {half} prompt {length} c{c}: {tok_s}", file=sys.stderr, flush=True)


def summarize(length: int, c: int, res: dict) -> dict:
    halves = [statistics.median(p) for p in res["pairs"]]
    pairs = sorted(res["pairs"][0] + res["pairs"][1])
    row = {"prompt_len": length, "concurrency": c, "server_tok_s": statistics.median(res["server"])}
    row.update(engine_tok_s=statistics.median(res["engine"]), ratio=math.sqrt(halves[0] * halves[1]))
    row.update(ratio_server_first=halves[0], ratio_engine_first=halves[1])
    row.update(ratio_min=pairs[0], ratio_max=pairs[-1])
    for key, total in res["cpu"].items():
        n = res["tokens"]["engine" if key == "engine" else "server"]
        row[f"{key}_cpu_ms_per_tok"] = 1000 * total / max(n, 1)
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default=None)
    p.add_argument("--num-requests", type=int, default=32)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--prompt-lens", default="128,512")
    p.add_argument("--concurrency", default="1,4,16")
    p.add_argument("--max-num-seqs", type=int, default=16)
    p.add_argument("--max-token-id", type=int, default=MAX_TOKEN_ID)
    p.add_argument("--kv-cache-dtype", default="auto", help="both sides' KV cache (auto: what fd serve uses)")
    p.add_argument(
        "--repeats", type=int, default=1, help="alternated pairs per load in each half (see above)"
    )
    p.add_argument(
        "--client-cpus",
        choices=["any", "front-end"],
        default="any",
        help="where the HTTP client runs during server runs (see the module docstring)",
    )
    p.add_argument("--json", default=None)
    args = p.parse_args()
    loads = [(int(n), int(c)) for n in args.prompt_lens.split(",") for c in args.concurrency.split(",")]

    results: dict = {}
    sides = Sides(args)  # the server first, then the in-process engine
    try:
        measure_half(sides, loads, 0, results)
        sides.start_server()  # a new server, loaded after the engine
        measure_half(sides, loads, 1, results)
    finally:
        sides.stop_server()
    rows = [summarize(length, c, res) for (length, c), res in results.items()]
    print_table(rows)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)


def print_table(rows: list[dict]) -> None:
    print(
        f"{'prompt':>7} {'conc':>5} {'server tok/s':>13} {'engine tok/s':>13} {'ratio':>6} {'(halves)':>13}"
        f" {'(range)':>13}   CPU ms/token: {'front end':>9} {'core':>6} {'client':>6} {'in-proc':>7}"
    )
    for r in rows:
        print(
            f"{r['prompt_len']:>7} {r['concurrency']:>5} {r['server_tok_s']:>13.1f} {r['engine_tok_s']:>13.1f} "
            f"{r['ratio']:>6.3f} {r['ratio_server_first']:>6.3f}/{r['ratio_engine_first']:<6.3f} "
            f"{r['ratio_min']:>6.3f}-{r['ratio_max']:<6.3f}   {'':>13}"
            f"{r['front_end_cpu_ms_per_tok']:>9.2f} {r['core_cpu_ms_per_tok']:>6.2f} "
            f"{r['client_cpu_ms_per_tok']:>6.2f} {r['engine_cpu_ms_per_tok']:>7.2f}"
        )


if __name__ == "__main__":
    main()
