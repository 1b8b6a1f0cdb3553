"""Every ISA path the CPU can run passes the same kernel tests: this directory is re-run in a subprocess
with FD_KERNELS_ISA forced lower (the default run already covers the best path)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


def _cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    for line in text.splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


@pytest.mark.parametrize("isa", ["avx512", "avx2", "scalar"])
def test_lower_isa_path_passes_kernel_tests(isa):
    if isa == "avx512" and not {"amx_bf16", "amx_tile"} <= _cpu_flags():
        pytest.skip("without AMX the default run already is the AVX-512 path")
    if isa == "avx2" and not {"avx2", "fma"} <= _cpu_flags():
        pytest.skip("CPU has no AVX2/FMA")
    if os.environ.get("FD_KERNELS_ISA"):
        pytest.skip("already running under a forced ISA")
    env = dict(os.environ, FD_KERNELS_ISA=isa)
    # Skipped in the re-runs: the real-model tensors (slow to read, same code as the shape sweep) and the
    # fresh-process cache test (ISA-independent).
    cmd = [
        sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", str(HERE),
        f"--ignore={HERE / 'test_isa.py'}", f"--ignore={HERE / 'test_gguf_model.py'}",
        "-k", "not cached_build",
    ]  # fmt: skip
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
