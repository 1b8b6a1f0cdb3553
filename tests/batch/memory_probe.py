"""Run as a script by test_memory.py: a batch through a model-free engine; prints peak-RSS figures.

argv: input.jsonl output.jsonl warmup.jsonl. Prints JSON {"baseline_kb", "peak_kb", "succeeded"}.
"""

from __future__ import annotations

import json
import resource
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from fake_engine import FakeEngine  # noqa: E402

from fdcli_engine.entrypoints.batch import BatchOptions, run_batch  # noqa: E402


def main() -> None:
    src, out, warmup = (Path(a) for a in sys.argv[1:4])
    # Warm-up run: every lazy import and cache is paid for before the baseline is taken.
    run_batch(BatchOptions(warmup, out.with_suffix(".warm"), progress=False), {}, lambda _: FakeEngine())
    baseline = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    summary = run_batch(BatchOptions(src, out, progress=False, max_inflight=64), {}, lambda _: FakeEngine())
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"baseline_kb": baseline, "peak_kb": peak, "succeeded": summary.succeeded}))


if __name__ == "__main__":
    main()
