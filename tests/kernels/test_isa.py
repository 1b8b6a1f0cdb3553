"""Every ISA path the CPU can run passes the same kernel tests: this directory is re-run in a subprocess
with FD_KERNELS_ISA forced lower (the default run already covers the best path)."""

from __future__ import annotations

from pathlib import Path

import pytest
from isa_levels import ISA_LEVELS, rerun_at_isa

HERE = Path(__file__).resolve().parent


@pytest.mark.parametrize("isa", ISA_LEVELS)
def test_lower_isa_path_passes_kernel_tests(isa):
    # Skipped in the re-runs: the real-model tensors (slow to read, same code as the shape sweep) and the
    # fresh-process cache test (ISA-independent).
    args = [str(HERE), f"--ignore={HERE / 'test_isa.py'}", f"--ignore={HERE / 'test_gguf_model.py'}"]
    rerun_at_isa(isa, [*args, "-k", "not cached_build"])
