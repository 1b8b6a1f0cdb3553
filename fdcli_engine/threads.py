"""One OpenMP runtime, sized once: Paddle's bundled libiomp5 serves Paddle's own kernels and fd's."""

from __future__ import annotations

import contextlib
import ctypes
import glob
import io
import os


def import_paddle():
    """Import paddle without its start-up banner: it prints a warning to stderr whenever
    OMP_NUM_THREADS > 1, which fd sets on purpose (Paddle would otherwise use one core)."""
    with contextlib.redirect_stderr(io.StringIO()):
        import paddle
    return paddle


def set_num_threads(n: int) -> None:
    """Resize the thread pool after paddle is imported (OMP_NUM_THREADS only counts before)."""
    os.environ["OMP_NUM_THREADS"] = str(n)
    paddle = import_paddle()
    libs = glob.glob(os.path.join(os.path.dirname(paddle.__file__), "libs", "libiomp5*.so*"))
    for path in libs:
        try:
            ctypes.CDLL(path).omp_set_num_threads(ctypes.c_int(n))
        except (OSError, AttributeError):
            continue
