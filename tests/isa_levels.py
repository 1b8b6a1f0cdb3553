"""Re-running tests under a lower ISA level: the default run covers the best path the CPU has, and a test
that calls `rerun_at_isa` runs the given pytest arguments again in a subprocess with FD_KERNELS_ISA
forced to `isa`, skipping the levels this CPU cannot run or that the default run already is."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from fd_kernels.native import FORCED_ISAS

# The levels a test can force (FD_KERNELS_ISA), best first: csrc/kernels.cc's, as fd_kernels names them.
ISA_LEVELS = list(FORCED_ISAS)


def cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    for line in text.splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


def cpu_levels() -> list[str]:
    """The levels of csrc/kernels.cc's detect_isa this CPU has, best first (from its flags)."""
    flags = cpu_flags()
    levels = ["scalar"]
    if {"avx2", "fma"} <= flags:
        levels.insert(0, "avx2")
        if {"avx512f", "avx512bw", "avx512vl", "avx512dq"} <= flags:
            levels.insert(0, "avx512")
            if "avx512_bf16" in flags:
                levels.insert(0, "avx512bf16")
                if {"amx_bf16", "amx_tile"} <= flags:
                    levels.insert(0, "amx")
    return levels


def rerun_at_isa(isa: str, pytest_args: list[str]) -> None:
    """Fails with the subprocess's output tail if the re-run fails."""
    levels = cpu_levels()
    if isa not in levels:
        pytest.skip(f"the CPU cannot run the {isa} level")
    if isa == levels[0]:
        pytest.skip(f"the default run already is the {isa} level")
    if os.environ.get("FD_KERNELS_ISA"):
        pytest.skip("already running under a forced ISA")
    env = dict(os.environ, FD_KERNELS_ISA=isa)
    cmd = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *pytest_args]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
