"""Re-running tests under a lower ISA level: the default run covers the best path the CPU has, and a test
that calls `rerun_at_isa` runs the given pytest arguments again in a subprocess with FD_KERNELS_ISA
forced to `isa`, skipping the levels this CPU cannot run or that the default run already is."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ISA_LEVELS = ["avx512", "avx2", "scalar"]


def cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    for line in text.splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


def rerun_at_isa(isa: str, pytest_args: list[str]) -> None:
    """Fails with the subprocess's output tail if the re-run fails."""
    if isa == "avx512" and not {"amx_bf16", "amx_tile"} <= cpu_flags():
        pytest.skip("without AMX the default run already is the AVX-512 path")
    if isa == "avx2" and not {"avx2", "fma"} <= cpu_flags():
        pytest.skip("CPU has no AVX2/FMA")
    if os.environ.get("FD_KERNELS_ISA"):
        pytest.skip("already running under a forced ISA")
    env = dict(os.environ, FD_KERNELS_ISA=isa)
    cmd = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *pytest_args]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
