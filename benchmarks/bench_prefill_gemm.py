"""fd's prompt-row GEMM against torch's oneDNN bf16 linear on the same shapes and threads, one run.

    OMP_NUM_THREADS=2 python benchmarks/bench_prefill_gemm.py [--rows 128,512,2048] [--passes 3]
        [--torch-dtypes bf16,fp32]

For each shape y[M,N] = x[M,K] @ W^T it times fd's `linear` with every row marked as a prompt row (the
path a prefill takes: AMX bf16 tiles on CPUs that have them, csrc/amx.cc) for GGUF Q4_1 and Q8_0, wint8
and wint4 weights, and `torch.nn.functional.linear` on bf16 tensors (oneDNN), alternating the two in
each pass and keeping each one's best pass. Both allocate their output on every call, as a model step
does (torch bf16, fd fp32: fd's linear takes and returns fp32). It prints GFLOP/s and fd / torch. The
shapes are SmolLM2-135M's (fused qkv 576 -> 960, o_proj 576 -> 576, fused gate_up 576 -> 3072, down 1536 -> 576,
LM head 576 -> 49152) and a tiny test model's (64 -> 128).

--torch-dtypes bf16,fp32 also times torch's fp32 linear (oneDNN / MKL sgemm) and takes the ratio against the
faster of the two: on a CPU without bf16 instructions (AVX2 only) torch's bf16 linear is many times slower
than its fp32 one, so the bf16 figure alone would overstate fd's lead there.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

os.environ.setdefault("OMP_NUM_THREADS", str(os.cpu_count() or 1))

import numpy as np  # noqa: E402
import paddle  # noqa: E402
import torch  # noqa: E402
from fd_kernels import native  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_kernels import best_time  # noqa: E402

SHAPES = [(576, 960), (576, 576), (576, 3072), (1536, 576), (576, 49152), (64, 128)]
FORMATS = ("q4_1", "q8_0", "wint8", "wint4")
TORCH_DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


def _weight(fmt: str, w: np.ndarray):
    if fmt in ("q4_1", "q8_0"):
        from gguf import GGMLQuantizationType
        from gguf.quants import quantize

        t = GGMLQuantizationType.Q4_1 if fmt == "q4_1" else GGMLQuantizationType.Q8_0
        return native.prepare_linear_gguf(quantize(w, t), int(t), w.shape[1])
    return native.prepare_linear(w, None, fmt)


def measure(m: int, k: int, n: int, passes: int, torch_dtypes: list[str], rng) -> dict[str, float]:
    """GFLOP/s of each torch dtype and of each format, each the best of `passes` alternated passes."""
    w = rng.standard_normal((n, k), dtype=np.float32) * 0.05
    x = rng.standard_normal((m, k), dtype=np.float32)
    flop = 2.0 * m * n * k
    tensors = {
        d: (torch.from_numpy(x).to(TORCH_DTYPES[d]), torch.from_numpy(w).to(TORCH_DTYPES[d]))
        for d in torch_dtypes
    }
    px, rows = paddle.to_tensor(x), paddle.ones([m], dtype="uint8")
    weights = {f: _weight(f, w) for f in FORMATS}
    best = {name: 0.0 for name in (*torch_dtypes, *FORMATS)}
    for _ in range(passes):
        # Paddle's OpenMP workers (libiomp5) spin for KMP_BLOCKTIME (200 ms) after fd's last call and
        # would take the cores from torch's own OpenMP threads: let them go to sleep first.
        for d, (tx, tw) in tensors.items():
            time.sleep(0.25)
            best[d] = max(
                best[d], flop / best_time(lambda tx=tx, tw=tw: torch.nn.functional.linear(tx, tw)) / 1e9
            )
        for f, lw in weights.items():
            best[f] = max(best[f], flop / best_time(lambda lw=lw: native.linear(px, lw, rows)) / 1e9)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default="128,512,2048", help="comma-separated M values")
    ap.add_argument("--passes", type=int, default=3)
    ap.add_argument(
        "--torch-dtypes", default="bf16", help="comma-separated: bf16, fp32 (ratio: the faster one)"
    )
    args = ap.parse_args()
    torch_dtypes = args.torch_dtypes.split(",")
    if not torch_dtypes or any(d not in TORCH_DTYPES for d in torch_dtypes):
        ap.error(f"--torch-dtypes: comma-separated values of {', '.join(TORCH_DTYPES)}")
    threads = int(os.environ["OMP_NUM_THREADS"])
    torch.set_num_threads(threads)
    print(
        f"isa {native.active_isa()}, {threads} threads, torch {torch.__version__} (oneDNN {'/'.join(torch_dtypes)})",
        file=sys.stderr,
    )
    rng = np.random.default_rng(0)
    head = f"{'M':>5} {'K':>5} {'N':>6} " + " ".join(f"{'t-' + d:>7}" for d in torch_dtypes) + " "
    head += " ".join(f"{f:>7} {'ratio':>5}" for f in FORMATS)
    print(head + "   GFLOP/s, ratio = fd / torch" + (" (its faster dtype)" if len(torch_dtypes) > 1 else ""))
    ratios = []
    for m in (int(r) for r in args.rows.split(",")):
        for k, n in SHAPES:
            r = measure(m, k, n, args.passes, torch_dtypes, rng)
            torch_best = max(r[d] for d in torch_dtypes)
            cells = " ".join(f"{r[d]:7.0f}" for d in torch_dtypes) + " "
            cells += " ".join(f"{r[f]:7.0f} {r[f] / torch_best:5.2f}" for f in FORMATS)
            print(f"{m:5d} {k:5d} {n:6d} {cells}", flush=True)
            ratios += [r[f] / torch_best for f in FORMATS]
    print(f"geometric mean fd / torch over every cell: {np.exp(np.mean(np.log(ratios))):.2f}")


if __name__ == "__main__":
    main()
