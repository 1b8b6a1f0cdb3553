"""Decode at batch 1 against the memory roofline, in one run: the step time, and the time per output token
of one streaming request through `fd serve`, over the time to read the step's bytes once at this machine's
read bandwidth, measured in the same process and alternated with them.

    OMP_NUM_THREADS=2 python benchmarks/bench_decode_roofline.py [--passes 5] [--decode-len 128] [--no-serve]

Bytes per step: every tensor of the default model's GGUF file once (its tied Q8_0 embedding is the LM
head, read whole each step; the embedding lookup reads one row, ignored) plus the bf16 KV cache the step
attends over at the run's mean context.
Read once: `fd_kernels.native.read_bytes` on a buffer of as many bytes, each OpenMP thread its own
contiguous half with four independent chains of full-width vector loads (the kernels' threads and ISA).
Step time: (a run of DECODE_LEN tokens - a run of 1 token) / (DECODE_LEN - 1), greedy, one request,
in-process (`LLM.generate`). Serve TPOT: the same difference for one streaming completion request
(ignore_eos, temperature 0) through an `fd serve` subprocess on the default model: HTTP, SSE, the engine
core process, detokenization and the engine loop included.
Each pass: the read (best of --reads), the in-process runs, the serve runs, the read again; a pass's bound
uses its best read. The machine is shared, so every figure is printed per pass and as a range.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

os.environ.setdefault("OMP_NUM_THREADS", str(os.cpu_count() or 1))
SERVER_ENV = dict(os.environ)  # the server's engine core picks its own OpenMP defaults (core_proc.py)
# The engine core sets KMP_BLOCKTIME=1: the in-process engine gets the same. It does not bind its threads
# (FD_CPU_OMP_THREADS_BIND): on a machine other processes share, a thread bound to a CPU one of them holds
# waits for it, and every parallel region with it (the step ran 3x slower so).
from fdcli_engine.threads import set_omp_defaults  # noqa: E402  (after SERVER_ENV: importing sets variables)

set_omp_defaults(bind=False)

PROMPT_LEN = 32


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def step_bytes(model_path: str, hf_config, context: float) -> int:
    """Bytes one decode step reads: the model's tensors and the KV cache at `context` tokens."""
    from gguf import GGUFReader

    weights = sum(int(t.n_bytes) for t in GGUFReader(model_path).tensors)
    c = hf_config
    head_dim = c["hidden_size"] // c["num_attention_heads"]
    kv = context * c["num_hidden_layers"] * 2 * c["num_key_value_heads"] * head_dim * 2  # K and V, bf16
    return int(weights + kv)


def serve_request(url: str, prompt: list[int], n: int) -> float:
    """Seconds of one streaming completion of exactly n tokens (every stream checked: stream_client.py)."""
    from stream_client import run, stream_completion

    body = {
        "prompt": prompt,
        "max_tokens": n,
        "ignore_eos": True,
        "temperature": 0,
        "stream": True,
        "return_token_ids": True,
    }
    return _timed(lambda: run(stream_completion(url, "/v1/completions", body, expected_tokens=n)))


def per_token(run_n, decode_len: int) -> float:
    """(a DECODE_LEN-token run - the faster of two 1-token runs) / (DECODE_LEN - 1)."""
    t_long = run_n(decode_len)
    t_one = min(run_n(1), run_n(1))
    return (t_long - t_one) / (decode_len - 1)


def _range(xs: list[float], scale: float = 1.0, fmt: str = "{:.2f}") -> str:
    return f"{fmt.format(min(xs) * scale)}-{fmt.format(max(xs) * scale)}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--passes", type=int, default=5)
    ap.add_argument("--reads", type=int, default=10, help="reads per probe (the best counts)")
    ap.add_argument("--decode-len", type=int, default=128)
    ap.add_argument("--no-serve", action="store_true", help="skip the `fd serve` measurement")
    args = ap.parse_args()

    import numpy as np
    from fd_kernels import native
    from stream_client import start_fd_serve, stop_fd_serve

    from fdcli_engine import LLM, SamplingParams, ops
    from fdcli_engine.config import default_model_path

    llm = LLM(None, max_model_len=1024)
    prompt = [100 + (i * 7919) % 30000 for i in range(PROMPT_LEN)]
    nbytes = step_bytes(str(default_model_path()), llm.config.hf_config, PROMPT_LEN + args.decode_len / 2)
    buf = np.ones(nbytes, dtype=np.uint8)

    def generate(n: int) -> float:
        params = SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)
        return _timed(lambda: llm.generate([prompt], params))

    def read_best() -> float:
        return min(_timed(lambda: native.read_bytes(buf)) for _ in range(args.reads))

    server = None if args.no_serve else start_fd_serve(["--max-model-len", "1024"], SERVER_ENV)
    try:
        generate(4)  # warm-up
        if server:
            serve_request(server[1], prompt, 4)
        rows = []
        for p in range(args.passes):
            t_read = read_best()
            step = per_token(generate, args.decode_len)
            tpot = (
                per_token(lambda n: serve_request(server[1], prompt, n), args.decode_len) if server else None
            )
            t_read = min(t_read, read_best())
            rows.append((t_read, step, tpot))
            serve = f", serve TPOT {tpot * 1e3:.3f} ms = {tpot / t_read:.2f}x" if server else ""
            print(
                f"pass {p}: read {nbytes / t_read / 1e9:5.1f} GB/s ({t_read * 1e3:.3f} ms), "
                f"step {step * 1e3:.3f} ms = {step / t_read:.2f}x{serve}",
                flush=True,
            )
    finally:
        if server:
            stop_fd_serve(server[0])
    reads, steps = [r[0] for r in rows], [r[1] for r in rows]
    print(f"kernels: {ops.describe()}, threads {os.environ['OMP_NUM_THREADS']}", file=sys.stderr)
    print(f"bytes per step        {nbytes / 1e6:8.1f} MB (weights + bf16 KV at the mean context)")
    print(f"read bandwidth        {_range([nbytes / t for t in reads], 1e-9, '{:.1f}')} GB/s over passes")
    print(f"roofline step         {_range(reads, 1e3, '{:.3f}')} ms")
    print(f"decode step, batch 1  {_range(steps, 1e3, '{:.3f}')} ms")
    print(f"step / roofline       {_range([s / t for t, s, _ in rows])}x per pass (issue #29's bound: 1.25x)")
    print(f"best step / best read {min(steps) / min(reads):.2f}x")
    if server:
        tpots = [r[2] for r in rows]
        print(f"serve c1 TPOT         {_range(tpots, 1e3, '{:.3f}')} ms")
        print(f"TPOT / roofline       {_range([s / t for t, _, s in rows])}x per pass")
        print(f"TPOT over the step    {_range([s - st for _, st, s in rows], 1e3, '{:.3f}')} ms per pass")
    return 0


if __name__ == "__main__":
    sys.exit(main())
