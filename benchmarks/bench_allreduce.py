"""All-reduce latency of the tensor-parallel collectives: the shared-memory group (ShmGroup) against
gloo (GlooGroup), 2 ranks on this host, one thread each (each pinned to its own CPU where there are
enough), fp32 tensors of a decode step's shapes.

    python benchmarks/bench_allreduce.py [--shapes 1x576,16x576,512x576] [--iters 2000] [--repeats 3]

Both groups are up at once; each shape is measured in turns (shm, then gloo) that alternate over the
repeats. Prints, per shape, each backend's median and p90 in microseconds (rank 0's clock, one call from
entry to return) and the gloo / shm ratio of the medians.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import time


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def quantiles(samples: list[float]) -> tuple[float, float]:
    s = sorted(samples)
    return s[len(s) // 2] * 1e6, s[len(s) * 9 // 10] * 1e6


def rank_main(rank: int, args) -> None:
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) >= 2:
        os.sched_setaffinity(0, {cpus[rank % len(cpus)]})
    import paddle  # noqa: PLC0415

    from fdcli_engine.distributed import init_tp_group  # noqa: PLC0415

    groups = {
        "shm": init_tp_group(rank, 2, "127.0.0.1", args.shm_port, 2, 60, backend="shm"),
        "gloo": init_tp_group(rank, 2, "127.0.0.1", args.gloo_port, 1, 60, backend="gloo"),
    }
    iters = {"shm": args.iters, "gloo": max(50, args.iters // 4)}  # gloo is ~100x slower per call
    for shape in args.shapes:
        samples: dict[str, list[float]] = {"shm": [], "gloo": []}
        for rep in range(args.repeats):
            for name in ("shm", "gloo") if rep % 2 == 0 else ("gloo", "shm"):
                g = groups[name]
                x = paddle.zeros(shape)  # a sum of zeros stays zero: no inf or NaN over the calls
                for _ in range(10):
                    g.all_reduce(x)
                g.barrier()
                for _ in range(iters[name]):
                    t = time.perf_counter()
                    g.all_reduce(x)
                    samples[name].append(time.perf_counter() - t)
        if rank == 0:
            (sm, sp), (gm, gp) = quantiles(samples["shm"]), quantiles(samples["gloo"])
            label = "x".join(map(str, shape))
            print(
                f"[{label:>7}] fp32  shm median {sm:8.1f} us  p90 {sp:8.1f} us | "
                f"gloo median {gm:8.1f} us  p90 {gp:8.1f} us | gloo/shm {gm / sm:6.1f}x",
                flush=True,
            )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--shapes", default="1x576,16x576,512x576")
    p.add_argument("--iters", type=int, default=2000)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--rank", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--shm-port", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--gloo-port", type=int, default=0, help=argparse.SUPPRESS)
    args = p.parse_args()
    args.shapes = [[int(d) for d in s.split("x")] for s in args.shapes.split(",")]
    if args.rank is not None:
        rank_main(args.rank, args)
        return
    ports = ["--shm-port", str(free_port()), "--gloo-port", str(free_port())]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "GLOG_minloglevel": "2"}
    cmd = [sys.executable, __file__, *sys.argv[1:], *ports]
    procs = [subprocess.Popen([*cmd, "--rank", str(r)], env=env) for r in range(2)]
    sys.exit(max(p.wait() for p in procs))


if __name__ == "__main__":
    main()
