"""`fd run-batch` on Ray (`--distributed-executor-backend ray`, a local Ray instance, one actor per CPU of
one thread each) against the single-process run (one engine core with every CPU), on the same input,
alternating between repeats.

    python benchmarks/bench_run_batch_ray.py [--lines 32] [--output-len 64] [--repeats 2] [--model PATH]
        (default model: SmolLM2)

Prints each setting's median output tokens/s over the run's own wall time (the summary's, which starts
after the model is loaded and, on Ray, after the actors are up) and the Ray / single-process ratio, plus
each setting's whole-command wall time (start-up included). On one machine both use the same CPUs, so the
ratio says what one engine per actor (its serving work in its own process and GIL, no overlap with the
step) costs against one engine core beside the front end; across N machines the actors multiply.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from fdcli_engine.threads import usable_cpu_count


def _input(path: Path, lines: int, output_len: int) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for i in range(lines):
            body = {
                "messages": [{"role": "user", "content": f"Tell me a story about the number {i}."}],
                "max_tokens": output_len,
                "temperature": 0,
                "ignore_eos": True,
            }
            f.write(json.dumps({"custom_id": f"r{i}", "url": "/v1/chat/completions", "body": body}) + "\n")


def _run(args: list[str], summary: Path) -> tuple[float, float]:
    t0 = time.perf_counter()
    proc = subprocess.run(args, capture_output=True, env={**os.environ, "RAY_USAGE_STATS_ENABLED": "0"})
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        sys.exit(proc.stderr.decode()[-2000:])
    return json.loads(summary.read_text())["output_tokens_per_s"], wall


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--lines", type=int, default=32)
    p.add_argument("--output-len", type=int, default=64)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--model", default=None)
    args = p.parse_args()
    cpus = usable_cpu_count()
    tmp = Path(tempfile.mkdtemp(prefix="fd-bench-ray-"))
    src = tmp / "in.jsonl"
    _input(src, args.lines, args.output_len)
    base = [sys.executable, "-m", "fdcli.main", "run-batch", "-i", str(src), "-o", str(tmp / "out.jsonl")]
    base += ["--summary-json", str(tmp / "summary.json"), "--max-num-seqs", "16"]
    base += ["--model", args.model] if args.model else []
    settings = {
        f"single process ({cpus} threads)": [*base, "--threads", str(cpus)],
        f"Ray, {cpus} actors x 1 thread": [*base, "--threads", "1", "--distributed-executor-backend", "ray"],
    }
    tok_s: dict[str, list[float]] = {name: [] for name in settings}
    walls: dict[str, list[float]] = {name: [] for name in settings}
    names = list(settings)
    try:
        for r in range(args.repeats):
            for name in names if r % 2 == 0 else names[::-1]:
                rate, wall = _run(settings[name], tmp / "summary.json")
                tok_s[name].append(rate)
                walls[name].append(wall)
                print(
                    name, "repeat", r, round(rate, 1), "tok/s,", round(wall, 1), "s in all", file=sys.stderr
                )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    medians = {name: statistics.median(v) for name, v in tok_s.items()}
    for name in names:
        print(f"{name}: {medians[name]:.1f} output tok/s, {statistics.median(walls[name]):.1f} s per command")
    print(f"ratio Ray / single process: {medians[names[1]] / medians[names[0]]:.3f}x")


if __name__ == "__main__":
    main()
