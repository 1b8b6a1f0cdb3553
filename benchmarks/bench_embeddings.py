"""Embeddings/s of all-MiniLM-L6-v2 through `fd serve` versus transformers in-process (torch CPU fp32).

Batch 1: one sentence per /v1/embeddings request, requests one after another (latency-bound).
Batch B (default 64): B sentences per request. The transformers run does the same work in-process:
tokenize (padding to the longest in the batch), BertModel, mask-weighted mean, L2 normalize.
Both use the same number of threads (--threads, default: all cores). The server is started here and
stopped at the end; its startup is not timed. Every figure is the best of --repeats runs.

    python benchmarks/bench_embeddings.py [--batches 1,64] [--num-sentences 256] [--repeats 3]
        [--threads N] [--json out.json]

Both sides share the machine: run it when nothing else is busy. The 1-minute load average is printed
before and after (and saved with --json): above the core count, the figures (torch's most of all, its
threads spin-wait for each other) say more about the neighbours than about either side; compare the
ratio of one run, never figures across runs.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import socket
import subprocess
import sys
import time

THREADS = os.cpu_count() or 1
os.environ.setdefault("OMP_NUM_THREADS", str(THREADS))

WORDS = (
    "the model serves embeddings for search and clustering of short and long sentences about weather "
    "markets rockets music cooking history physics football databases gardens rivers and mountains"
).split()


def make_sentences(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(6, 40))) + "." for _ in range(n)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(model: str, threads: int, max_batch: int):
    import httpx

    port = free_port()
    cmd = [sys.executable, "-m", "fdcli.main", "serve", "--model", model, "--port", str(port)]
    cmd += ["--threads", str(threads), "--max-num-seqs", str(max(64, max_batch))]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"fd serve exited with {proc.returncode}")
        try:
            if httpx.get(f"{url}/ready", timeout=2).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    proc.kill()
    raise SystemExit("fd serve did not become ready in 180 s")


def bench_server(url: str, sentences: list[str], batch: int) -> float:
    import httpx

    with httpx.Client(base_url=url, timeout=600) as c:
        t0 = time.perf_counter()
        for k in range(0, len(sentences), batch):
            r = c.post("/v1/embeddings", json={"input": sentences[k : k + batch]})
            r.raise_for_status()
        return len(sentences) / (time.perf_counter() - t0)


def bench_transformers(tok, model, sentences: list[str], batch: int) -> float:
    import torch

    t0 = time.perf_counter()
    for k in range(0, len(sentences), batch):
        enc = tok(
            sentences[k : k + batch], padding=True, truncation=True, max_length=256, return_tensors="pt"
        )
        with torch.no_grad():
            h = model(**enc).last_hidden_state
        mask = enc["attention_mask"].unsqueeze(-1).float()
        torch.nn.functional.normalize((h * mask).sum(1) / mask.sum(1), dim=-1)
    return len(sentences) / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", default="1,64")
    ap.add_argument("--num-sentences", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=THREADS)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    batches = [int(b) for b in args.batches.split(",")]

    import torch
    from transformers import AutoModel, AutoTokenizer

    from fdcli_engine.config import default_embedding_model_path

    model_path = str(default_embedding_model_path())
    torch.set_num_threads(args.threads)
    tok, hf = AutoTokenizer.from_pretrained(model_path), AutoModel.from_pretrained(model_path).eval()
    sentences = make_sentences(args.num_sentences)
    proc, url = start_server(model_path, args.threads, max(batches))
    load = [os.getloadavg()[0]]
    print(f"load average {load[0]:.2f} on {os.cpu_count()} cores")
    rows = []
    try:
        for batch in batches:
            n = sentences if batch > 1 else sentences[: max(32, args.num_sentences // 4)]
            bench_server(url, n[:batch], batch)  # warm-up
            bench_transformers(tok, hf, n[:batch], batch)
            fd = max(bench_server(url, n, batch) for _ in range(args.repeats))
            tr = max(bench_transformers(tok, hf, n, batch) for _ in range(args.repeats))
            rows.append({"batch": batch, "fd_serve_per_s": fd, "transformers_per_s": tr, "ratio": fd / tr})
            print(f"batch {batch:3d}: fd serve {fd:8.1f}/s   transformers {tr:8.1f}/s   ratio {fd / tr:.2f}")
    finally:
        proc.terminate()
        proc.wait(30)
    load.append(os.getloadavg()[0])
    print(f"load average {load[1]:.2f} at the end")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"threads": args.threads, "load_average": load, "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()
