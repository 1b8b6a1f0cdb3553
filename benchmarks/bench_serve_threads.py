"""The c1 time per output token of `fd serve` and the CPU each of its threads spends per token, for one
source tree or two side by side.

    python benchmarks/bench_serve_threads.py [--trees TREE [TREE]] [--rounds 6] [--output-len 128]

One `fd serve` per tree (its own PYTHONPATH: TREE and TREE/kernels), all started before the first request
and idle while another one serves, so the trees are measured in alternation under the same background
load. Each round sends every server, in turns (the order reversed every other round), one streaming
completion of --output-len tokens and two of 1 token (ignore_eos, temperature 0, a 32-token prompt,
every stream checked: stream_client.py); TPOT = (long - faster short) / (output-len - 1).

Per thread of the front end and of the engine core (Linux /proc/<pid>/task/<tid>/schedstat, nanoseconds):
CPU time, time waiting in a run queue, and context switches, per output token over the long requests.
On a machine the engine's OpenMP threads fill, every other thread's CPU time per token competes with them:
these figures say where the server's own time per token goes even when wall-clock figures are noisy.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

os.environ.setdefault("OMP_NUM_THREADS", str(os.cpu_count() or 1))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from stream_client import run, start_fd_serve, stop_fd_serve, stream_completion  # noqa: E402

PROMPT = [100 + (i * 7919) % 30000 for i in range(32)]


def request(url: str, n: int) -> float:
    body = {"prompt": PROMPT, "max_tokens": n, "ignore_eos": True, "temperature": 0, "stream": True}
    body["return_token_ids"] = True
    t0 = time.perf_counter()
    run(stream_completion(url, "/v1/completions", body, expected_tokens=n))
    return time.perf_counter() - t0


def thread_stats(pids: dict[str, int]) -> dict[tuple[str, str], tuple[int, int, int]]:
    """(process, thread id:name) -> (run ns, run-queue wait ns, switches) of every thread now."""
    out = {}
    for proc, pid in pids.items():
        for tid in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{tid}/comm") as f:
                    name = f.read().strip()
                with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                    out[(proc, f"{tid}:{name}")] = tuple(int(x) for x in f.read().split())
            except OSError:  # a thread that just exited
                continue
    return out


def server_pids(proc) -> dict[str, int]:
    import psutil

    for child in psutil.Process(proc.pid).children(recursive=True):
        if "fdcli_engine.api.core_proc" in " ".join(child.cmdline()):
            return {"front end": proc.pid, "core": child.pid}
    raise SystemExit("cannot find the server's engine-core process")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trees", nargs="+", default=[os.getcwd()], help="one or two source trees")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--output-len", type=int, default=128)
    args = ap.parse_args()
    n = args.output_len
    servers = []
    try:
        for tree in args.trees:
            tree = os.path.abspath(tree)
            env = dict(os.environ, PYTHONPATH=f"{tree}:{tree}/kernels")
            here = os.getcwd()
            os.chdir(tree)  # `python -m` puts the current directory ahead of PYTHONPATH
            try:
                proc, url = start_fd_serve(["--max-model-len", "1024"], env)
            finally:
                os.chdir(here)
            servers.append((tree, proc, url, server_pids(proc)))
        for _, _, url, _ in servers:
            request(url, 4)  # warm-up
        tpot = {s[0]: [] for s in servers}
        cpu = {s[0]: {} for s in servers}
        for r in range(args.rounds):
            for tree, _, url, pids in servers if r % 2 == 0 else servers[::-1]:
                before = thread_stats(pids)
                t_long = request(url, n)
                after = thread_stats(pids)
                for key, v in after.items():
                    if key in before:
                        acc = cpu[tree].setdefault(key, [0, 0, 0])
                        for i in range(3):
                            acc[i] += v[i] - before[key][i]
                tpot[tree].append((t_long - min(request(url, 1), request(url, 1))) / (n - 1))
        tokens = n * args.rounds
        for tree, *_ in servers:
            v = sorted(tpot[tree])
            print(
                f"{tree}: TPOT {v[0] * 1e3:.3f}-{v[-1] * 1e3:.3f} ms, median {statistics.median(v) * 1e3:.3f}"
            )
            for (proc, thread), (ns, wait, sw) in sorted(cpu[tree].items(), key=lambda kv: -kv[1][0]):
                if ns / tokens >= 1000:  # threads that ran at least 1 us a token
                    print(
                        f"  {proc:9s} {thread:22s} CPU {ns / tokens / 1e3:7.1f} us/token, run-queue wait "
                        f"{wait / tokens / 1e3:6.1f} us/token, {sw / tokens:.2f} switches/token"
                    )
        if len(servers) == 2:
            a, b = (tpot[s[0]] for s in servers)
            diffs = [x - y for x, y in zip(a, b)]
            print(
                f"paired rounds, first - second tree: median {statistics.median(diffs) * 1e6:+.1f} us, "
                f"first lower in {sum(d < 0 for d in diffs)}/{len(diffs)}"
            )
    finally:
        for _, proc, _, _ in servers:
            stop_fd_serve(proc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
