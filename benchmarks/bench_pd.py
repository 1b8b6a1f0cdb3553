"""Prefill/decode disaggregation against one mixed instance on the same CPUs: 1P1D (fd router + a
prefill and a decode `fd serve`, one thread and one CPU each) vs one mixed `fd serve` with two threads
on both CPUs, under a load of long prompts arriving while other requests decode.

    python benchmarks/bench_pd.py [--model PATH] [--decoders 4] [--decode-tokens 128]
        [--long 4] [--long-words 1500] [--long-tokens 16] [--interval 1.0]

`--decoders` short-prompt requests generate `--decode-tokens` tokens each from t=0; `--long` prompts
of about `--long-words` words arrive every `--interval` seconds from t=0.5 s and generate
`--long-tokens`. Every request streams (ignore_eos). Prints, per set-up, TTFT and TPOT (mean, p99,
in ms) of the decoders and of the long prompts, output tokens/s over the whole load, and the ratios
1P1D / mixed (TPOT p99 of the decoders: prefill interference; throughput: must stay above 0.8x).

`--pd-cpus shared` puts the prefill instance on both CPUs (nice `--p-nice`, OpenMP threads
`--p-bind`); `--max-local-prefill-length` is the router's flag (short prompts stay on the decode
instance). Both set-ups stay up and take the load in turns, `--rounds` times; each round prints its
ratios, and the median and range over the rounds end the report.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn(
    args: list[str], cpus: list[int] | None, log: Path, nice: int = 0, bind: str | None = None
) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": str(len(cpus) if cpus else 1)}
    if bind:
        env["FD_CPU_OMP_THREADS_BIND"] = bind

    def pre() -> None:
        if cpus:
            os.sched_setaffinity(0, set(cpus))
        if nice:
            os.nice(nice)

    cmd = [sys.executable, "-m", "fdcli.main", *args]
    return subprocess.Popen(
        cmd, stdout=log.open("w"), stderr=subprocess.STDOUT, cwd=REPO, env=env, preexec_fn=pre
    )


def wait_ok(url: str, procs: list[subprocess.Popen], timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(p.poll() is not None for p in procs):
            raise SystemExit(f"a process exited while starting ({url}); see the logs")
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise SystemExit(f"not ready after {timeout}s: {url}")


def serve_args(model: str | None, port: int, threads: int, *extra: str) -> list[str]:
    args = ["serve", "--port", str(port), "--threads", str(threads), "--served-model-name", "bench"]
    return args + (["--model", model] if model else []) + list(extra)


def start_pd(model, cpus, tmp: Path, shared=False, local=0, p_nice=10, p_bind=None):
    """1P1D: one CPU each, or (`shared`) the prefill instance on both CPUs at a lower priority (nice
    `p_nice`) with its OpenMP threads unbound (`p_bind`), and the decode instance on the second: prefill
    takes whatever CPU decoding leaves idle, and while the decode instance steps, the kernel moves the
    prefill thread it displaced to the other CPU instead of the whole prefill team waiting for it."""
    rport, pport, dport = free_port(), free_port(), free_port()
    r_args = ["router", "--port", str(rport), "--max-local-prefill-length", str(local)]
    router = spawn(r_args, None, tmp / "router.log")
    wait_ok(f"http://127.0.0.1:{rport}/instances", [router])
    via = ["--router", f"127.0.0.1:{rport}"]
    p_cpus = cpus[:2] if shared else cpus[:1]
    p_args = serve_args(model, pport, len(p_cpus), "--splitwise-role", "prefill", *via)
    p = spawn(p_args, p_cpus, tmp / "p.log", nice=p_nice if shared else 0, bind=p_bind)
    d = spawn(serve_args(model, dport, 1, "--splitwise-role", "decode", *via), cpus[1:2], tmp / "d.log")
    procs = [router, p, d]
    wait_ok(f"http://127.0.0.1:{rport}/health", procs)
    return f"http://127.0.0.1:{rport}", procs


def start_mixed(model, cpus, tmp: Path):
    port = free_port()
    proc = spawn(serve_args(model, port, 2), cpus[:2], tmp / "mixed.log")
    wait_ok(f"http://127.0.0.1:{port}/ready", [proc])
    return f"http://127.0.0.1:{port}", [proc]


async def one(client: httpx.AsyncClient, url: str, prompt: str, max_tokens: int, delay: float) -> dict:
    await asyncio.sleep(delay)
    body = {
        "model": "bench", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
        "stream": True, "stream_options": {"include_usage": True},
    }  # fmt: skip
    t0 = time.perf_counter()
    first = last = None
    tokens = 0
    async with client.stream("POST", f"{url}/v1/completions", json=body) as r:
        r.raise_for_status()
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            now = time.perf_counter()
            chunk = json.loads(line[6:])
            if chunk.get("usage") and not chunk.get("choices"):
                tokens = chunk["usage"]["completion_tokens"]
                continue
            first = first or now
            last = now
    return {"ttft": first - t0, "tpot": (last - first) / max(tokens - 1, 1), "tokens": tokens}


async def load(url: str, a, r: int = 0) -> tuple[list[dict], list[dict], float]:
    # Round r's prompts start with their own words: no prefix-cache hit on an earlier round's.
    long_prompt = " ".join(f"w{i % 89}" for i in range(a.long_words))
    async with httpx.AsyncClient(timeout=httpx.Timeout(600, connect=10)) as client:
        await one(client, url, "warm up", 4, 0)
        t0 = time.perf_counter()
        dec = [
            one(client, url, f"round {r} story {i}: once upon a time", a.decode_tokens, 0)
            for i in range(a.decoders)
        ]
        lng = [
            one(client, url, f"round {r} prompt {i} {long_prompt}", a.long_tokens, 0.5 + i * a.interval)
            for i in range(a.long)
        ]
        results = await asyncio.gather(*dec, *lng)
        wall = time.perf_counter() - t0
    return results[: a.decoders], results[a.decoders :], wall


def stats(xs: list[float]) -> tuple[float, float]:
    s = sorted(xs)
    return sum(s) / len(s) * 1e3, s[min(len(s) - 1, int(len(s) * 0.99))] * 1e3


def report(name: str, dec: list[dict], lng: list[dict], wall: float) -> dict:
    out = {
        "decode_ttft": stats([r["ttft"] for r in dec]),
        "decode_tpot": stats([r["tpot"] for r in dec]),
        "long_ttft": stats([r["ttft"] for r in lng]),
        "long_tpot": stats([r["tpot"] for r in lng]),
        "tok_s": sum(r["tokens"] for r in dec + lng) / wall,
    }
    print(f"{name}:")
    for key in ("decode_ttft", "decode_tpot", "long_ttft", "long_tpot"):
        print(f"  {key:12s} mean {out[key][0]:9.1f} ms   p99 {out[key][1]:9.1f} ms")
    print(f"  output       {out['tok_s']:9.1f} tok/s over {wall:.1f} s")
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None, help="model path (default: fd serve's default, SmolLM2)")
    p.add_argument("--decoders", type=int, default=4)
    p.add_argument("--decode-tokens", type=int, default=128)
    p.add_argument("--long", type=int, default=4)
    p.add_argument("--long-words", type=int, default=1500)
    p.add_argument("--long-tokens", type=int, default=16)
    p.add_argument("--interval", type=float, default=1.0)
    p.add_argument(
        "--pd-cpus",
        choices=["split", "shared"],
        default="split",
        help="split: P and D one CPU each; shared: P on both CPUs at nice 10, D on the second",
    )
    p.add_argument("--rounds", type=int, default=3, help="loads on each set-up, in turns")
    p.add_argument("--p-nice", type=int, default=10, help="shared: the prefill instance's nice level")
    p.add_argument(
        "--p-bind", default="nobind", help="shared: the prefill instance's FD_CPU_OMP_THREADS_BIND"
    )
    p.add_argument(
        "--max-local-prefill-length",
        type=int,
        default=512,
        help="the router's flag: shorter prompts are prefilled by the decode instance (0: none)",
    )
    a = p.parse_args()
    cpus = sorted(os.sched_getaffinity(0))
    cpus = (cpus * 2)[:2]  # one CPU: both roles share it (the comparison then says little)
    tmp = Path(tempfile.mkdtemp(prefix="bench-pd-"))
    shared = a.pd_cpus == "shared"
    pd_name = f"1P1D (P 2 threads {a.p_bind} at nice {a.p_nice}, D 1)" if shared else "1P1D (1 + 1 thread)"
    pd_kw = {
        "shared": shared,
        "local": a.max_local_prefill_length,
        "p_nice": a.p_nice,
        "p_bind": a.p_bind if shared else None,
    }
    procs: list[subprocess.Popen] = []
    try:
        # Both set-ups stay up (the idle one sleeps) and take the load in turns: a burst of other work
        # on the machine then spoils one round's pair, not the whole comparison.
        mixed_url, started = start_mixed(a.model, cpus, tmp)
        procs += started
        pd_url, started = start_pd(a.model, cpus, tmp, **pd_kw)
        procs += started
        pairs = []
        for r in range(a.rounds):
            mixed = report(f"round {r}: mixed (2 threads)", *asyncio.run(load(mixed_url, a, r)))
            pd = report(f"round {r}: {pd_name}", *asyncio.run(load(pd_url, a, r)))
            pairs.append(print_ratios(r, mixed, pd))
    finally:
        for proc in reversed(procs):
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
    if len(pairs) > 1:
        for key in pairs[0]:
            vals = sorted(p[key] for p in pairs)
            print(f"{key}: median {vals[len(vals) // 2]:.2f}x, range {vals[0]:.2f}-{vals[-1]:.2f}x")
    print(f"logs: {tmp}")


def print_ratios(r: int, mixed: dict, pd: dict) -> dict[str, float]:
    out = {
        "decoders' TPOT p99": pd["decode_tpot"][1] / mixed["decode_tpot"][1],
        "decoders' TPOT mean": pd["decode_tpot"][0] / mixed["decode_tpot"][0],
        "decoders' TTFT mean": pd["decode_ttft"][0] / mixed["decode_ttft"][0],
        "long prompts' TTFT mean": pd["long_ttft"][0] / mixed["long_ttft"][0],
        "output tok/s": pd["tok_s"] / mixed["tok_s"],
    }
    print(f"round {r} ratios 1P1D / mixed:")
    for key, v in out.items():
        print(f"  {key} {v:.2f}x")
    return out


if __name__ == "__main__":
    main()
