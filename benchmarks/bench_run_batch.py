"""Throughput of `fd run-batch` against the offline engine and against `fd serve` over HTTP.

Load (issue 5): N chat requests (default 256), distinct short user messages through the model's chat
template, 128 output tokens each (ignore_eos, greedy). Three runs, same engine options:

  offline   `fdcli_engine.api.LLM.chat(...)` on all N at once (what `fd bench throughput` measures)
  run-batch `run_batch()` on a JSONL file of the same N bodies, as `fd run-batch` runs it: its own
            engine-core process (wall time of the run, model load excluded, JSON parsing, serving,
            detokenizing and writing included)
  serve     `fd serve` subprocess, all N requests sent at once (non-streaming chat) with httpx

Optional: `--inproc` also runs run-batch over the offline run's EngineCore in this process
(InProcessEngineClient, step() on a worker thread; `--loop-driver`: step() on the event loop), the
driver run-batch used before it moved the core out of process. Prints output tokens/s of each and
run-batch's ratio to the others (best of --repeats; repeats interleave offline and run-batch). Model
load is excluded everywhere. The runs share the machine's cores: run it when nothing else is busy.

    python benchmarks/bench_run_batch.py [--model PATH] [--num-requests 256] [--output-len 128]
        [--max-num-seqs 64] [--repeats 1] [--inproc] [--skip-serve] [--json out.json]
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

os.environ.setdefault("OMP_NUM_THREADS", str(os.cpu_count() or 1))

TOPICS = ["the sea", "a robot", "autumn", "a city at night", "mountains", "a library", "coffee", "rain"]


def make_bodies(n: int, output_len: int) -> list[dict]:
    return [
        {
            "messages": [
                {"role": "user", "content": f"Write a short story about {TOPICS[i % len(TOPICS)]}, part {i}."}
            ],
            "max_tokens": output_len,
            "temperature": 0,
            "ignore_eos": True,
        }
        for i in range(n)
    ]


def load_llm(engine_args: dict):
    from fdcli_engine.api.llm import LLM

    return LLM(**engine_args)


def run_offline(llm, bodies: list[dict]) -> dict:
    from fdcli_engine.sampling_params import SamplingParams

    llm.engine.reset_prefix_cache()
    params = SamplingParams(max_tokens=bodies[0]["max_tokens"], temperature=0, ignore_eos=True)
    t0 = time.perf_counter()
    outs = llm.chat([b["messages"] for b in bodies], params)
    wall = time.perf_counter() - t0
    tokens = sum(len(o.outputs[0].token_ids) for o in outs)
    return {"wall_s": wall, "output_tokens": tokens, "output_tok_s": tokens / wall}


def write_batch_file(bodies: list[dict], tmp: Path) -> Path:
    src = tmp / "in.jsonl"
    with open(src, "w", encoding="utf-8") as f:
        for i, body in enumerate(bodies):
            line = {"custom_id": f"r{i}", "method": "POST", "url": "/v1/chat/completions", "body": body}
            f.write(json.dumps(line) + "\n")
    return src


def run_batch_file(engine_args: dict, bodies: list[dict], tmp: Path, llm=None, step_in_thread=True) -> dict:
    """run-batch as `fd run-batch` runs it (its own core process, loaded before the clock starts);
    with `llm`, in-process over the offline run's EngineCore instead."""
    from fdcli_engine.entrypoints.batch import BatchOptions, run_batch

    src = write_batch_file(bodies, tmp)
    factory = None
    if llm is not None:
        from fdcli_engine.api.inproc_client import InProcessEngineClient

        llm.engine.reset_prefix_cache()

        def factory(_args):
            return InProcessEngineClient(
                llm.config, llm.tokenizer, core=llm.engine, step_in_thread=step_in_thread
            )

    summary = run_batch(BatchOptions(src, tmp / "out.jsonl", progress=False), dict(engine_args), factory)
    assert summary.succeeded == len(bodies), summary.to_dict()
    return {
        "wall_s": summary.wall_time_s,
        "output_tokens": summary.completion_tokens,
        "output_tok_s": summary.output_tokens_per_s,
    }


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_serve(engine_args: dict, bodies: list[dict], tmp: Path) -> dict:
    import httpx

    port = _free_port()
    cmd = [sys.executable, "-m", "fdcli.main", "serve", "--port", str(port), "--max-concurrency", "1024"]
    for key, value in engine_args.items():
        cmd += [f"--{key.replace('_', '-')}", str(value)]
    log = open(tmp / "serve.log", "w")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while True:
            if proc.poll() is not None:
                raise SystemExit(f"fd serve exited: {(tmp / 'serve.log').read_text()[-2000:]}")
            try:
                if httpx.get(f"{url}/ready", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise SystemExit("fd serve did not become ready")
            time.sleep(0.5)
        return asyncio.run(_serve_load(url, bodies))
    finally:
        proc.terminate()
        proc.wait(60)
        log.close()


async def _serve_load(url: str, bodies: list[dict]) -> dict:
    import httpx

    limits = httpx.Limits(max_connections=len(bodies))
    async with httpx.AsyncClient(base_url=url, timeout=3600, limits=limits) as client:

        async def one(body):
            r = await client.post("/v1/chat/completions", json=body)
            r.raise_for_status()
            return r.json()["usage"]["completion_tokens"]

        t0 = time.perf_counter()
        counts = await asyncio.gather(*(one(b) for b in bodies))
        wall = time.perf_counter() - t0
    return {"wall_s": wall, "output_tokens": sum(counts), "output_tok_s": sum(counts) / wall}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=None, help="Default: the installed SmolLM2 GGUF.")
    ap.add_argument("--num-requests", type=int, default=256)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--max-num-seqs", type=int, default=64)
    ap.add_argument("--skip-serve", action="store_true")
    ap.add_argument("--repeats", type=int, default=1, help="Alternate offline/run-batch this many times.")
    ap.add_argument("--inproc", action="store_true", help="Also run-batch with the in-process client.")
    ap.add_argument(
        "--loop-driver", action="store_true", help="Also run-batch in-process with step() on the event loop."
    )
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    engine_args = {"max_num_seqs": args.max_num_seqs}
    if args.model:
        engine_args["model"] = args.model
    bodies = make_bodies(args.num_requests, args.output_len)
    results: dict[str, dict] = {}

    def record(name: str, result: dict) -> None:
        results[name] = result
        print(
            f"{name:18s} {result['output_tok_s']:8.1f} output tok/s  ({result['wall_s']:.1f} s)", flush=True
        )

    with tempfile.TemporaryDirectory(prefix="fd-bench-batch-") as tmp:
        llm = load_llm(engine_args)
        for rep in range(args.repeats):
            sfx = f"#{rep}" if args.repeats > 1 else ""
            record(f"offline{sfx}", run_offline(llm, bodies))
            record(f"run_batch{sfx}", run_batch_file(engine_args, bodies, Path(tmp)))
            if args.inproc:
                record(f"run_batch_inproc{sfx}", run_batch_file(engine_args, bodies, Path(tmp), llm))
            if args.loop_driver:
                loop = run_batch_file(engine_args, bodies, Path(tmp), llm, step_in_thread=False)
                record(f"run_batch_loop{sfx}", loop)
        del llm
        if not args.skip_serve:
            record("serve", run_serve(engine_args, bodies, Path(tmp)))
    best = {
        k: max(v["output_tok_s"] for n, v in results.items() if n.split("#")[0] == k)
        for k in {n.split("#")[0] for n in results}
    }
    print("best of repeats:", json.dumps({k: round(v, 1) for k, v in best.items()}))
    rb = best["run_batch"]
    for other in ("offline", "serve", "run_batch_inproc"):
        if other in best:
            print(f"run-batch / {other}: {rb / best[other]:.3f}")
    if args.json:
        args.json.write_text(json.dumps({"args": vars(args) | {"json": str(args.json)}, **results}, indent=2))


if __name__ == "__main__":
    main()
