"""Decode at batch 1 against the memory roofline, in one run: the step time over the time to read its bytes
once at this machine's two-thread read bandwidth, measured in the same process.

    OMP_NUM_THREADS=2 python benchmarks/bench_decode_roofline.py [--repeats 3] [--decode-len 128]

Bytes per step: every tensor of the default model's GGUF file once (its tied Q8_0 embedding is the LM
head, read whole each step; the embedding lookup reads one row, ignored) plus the bf16 KV cache the step
attends over at the run's mean context. Bandwidth: the best of repeated reads of a float32 buffer of the
same size, one part per thread, each thread a numpy `max` over its part (a plain vectorized stream that
releases the GIL; torch's and numpy's sums run at a third of it here).
Step time: (a run of DECODE_LEN tokens - a run of 1 token) / (DECODE_LEN - 1), greedy, one request.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

os.environ.setdefault("OMP_NUM_THREADS", str(os.cpu_count() or 1))

PROMPT_LEN = 32


def read_bandwidth(nbytes: int, repeats: int = 20) -> float:
    """Bytes per second of a read of an nbytes buffer by OMP_NUM_THREADS threads (the best pass)."""
    import threading

    import numpy as np

    parts = np.array_split(np.ones(nbytes // 4, dtype=np.float32), int(os.environ["OMP_NUM_THREADS"]))

    def read_all() -> None:
        threads = [threading.Thread(target=p.max) for p in parts]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    read_all()
    return nbytes / min(_timed(read_all) for _ in range(repeats))


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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--decode-len", type=int, default=128)
    args = ap.parse_args()

    from fdcli_engine import LLM, SamplingParams, ops
    from fdcli_engine.config import default_model_path

    llm = LLM(None, max_model_len=1024)
    prompt = [[100 + (i * 7919) % 30000 for i in range(PROMPT_LEN)]]

    def run(n: int) -> float:
        return _timed(
            lambda: llm.generate(prompt, SamplingParams(temperature=0, max_tokens=n, ignore_eos=True))
        )

    run(4)  # warm-up
    t_long = min(run(args.decode_len) for _ in range(args.repeats))
    t_one = min(run(1) for _ in range(args.repeats))
    step = (t_long - t_one) / (args.decode_len - 1)
    nbytes = step_bytes(str(default_model_path()), llm.config.hf_config, PROMPT_LEN + args.decode_len / 2)
    bw = read_bandwidth(nbytes)
    bound = nbytes / bw
    print(f"kernels: {ops.describe()}, threads {os.environ['OMP_NUM_THREADS']}", file=sys.stderr)
    print(f"bytes per step        {nbytes / 1e6:8.1f} MB (weights + bf16 KV at the mean context)")
    print(
        f"read bandwidth        {bw / 1e9:8.1f} GB/s ({os.environ['OMP_NUM_THREADS']} threads reading as many bytes)"
    )
    print(f"roofline step         {bound * 1e3:8.2f} ms")
    print(f"decode step, batch 1  {step * 1e3:8.2f} ms")
    print(f"step / roofline       {step / bound:8.2f}x   (issue #29's bound: at most 1.25x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
