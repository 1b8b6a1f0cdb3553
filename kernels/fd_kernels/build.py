"""JIT build of the C++ operators with paddle.utils.cpp_extension, cached by content hash.

The cache key covers the sources, the flags, and the Paddle and Python versions, so an edited kernel or a
new Paddle rebuilds and a warm start only imports the shared library (about a second). A file lock keeps
concurrent processes (tests, engine workers) from building the same directory at once.
"""

from __future__ import annotations

import contextlib
import fcntl
import glob
import hashlib
import io
import os
import shutil
import sys
from pathlib import Path

from fdcli_engine.errors import KernelBuildError

MODULE_NAME = "fd_kernels_ext"
CSRC = Path(__file__).resolve().parent / "csrc"

# Portable baseline; the AVX2 and AVX-512 paths are compiled per namespace with target pragmas and
# picked at run time (csrc/kernels.cc), so the cached library also runs on older x86-64 CPUs.
CXX_FLAGS = ["-O3", "-std=c++17", "-march=x86-64-v2", "-fopenmp", "-fno-math-errno", "-Wno-unused-function"]


def _paddle_libs() -> str:
    import paddle  # noqa: PLC0415

    return os.path.join(os.path.dirname(paddle.__file__), "libs")


def _ld_flags() -> list[str]:
    # OpenMP from Paddle's bundled libiomp5 (it also provides the GOMP_* entry points GCC emits): mixing
    # it with GCC's libgomp in one process made loops 1.3-1.7x slower (PADDLE_CPU.md).
    libs = _paddle_libs()
    if not os.path.exists(os.path.join(libs, "libiomp5.so")):
        return ["-fopenmp"]
    return [f"-L{libs}", "-l:libiomp5.so", f"-Wl,-rpath,{libs}"]


def _sources() -> list[str]:
    return sorted(glob.glob(str(CSRC / "*.cc")))


def cache_key() -> str:
    import paddle  # noqa: PLC0415

    h = hashlib.sha256()
    for path in sorted(glob.glob(str(CSRC / "*.cc")) + glob.glob(str(CSRC / "*.h"))):
        h.update(os.path.basename(path).encode())
        h.update(Path(path).read_bytes())
    h.update(" ".join(CXX_FLAGS + _ld_flags()).encode())
    h.update(f"{paddle.__version__}|{sys.version_info[:2]}".encode())
    return h.hexdigest()[:16]


def build_dir() -> Path:
    root = os.environ.get("FD_KERNELS_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "fd", "kernels"
    )
    return Path(root) / cache_key()


def _find_library(base: Path) -> str | None:
    hits = glob.glob(str(base / MODULE_NAME / "**" / f"{MODULE_NAME}*.so"), recursive=True)
    return hits[0] if hits else None


def _import_built(base: Path):
    from paddle.utils.cpp_extension import extension_utils  # noqa: PLC0415

    return extension_utils._import_module_from_library(MODULE_NAME, str(base / MODULE_NAME), False)


_loaded = None  # Paddle registers custom ops once per process: a second import would expose no ops


def load(verbose: bool = False):
    """Build (first time) or import the cached extension module; raises KernelBuildError on failure."""
    global _loaded
    if _loaded is None:
        _loaded = _load(verbose)
    return _loaded


def _load(verbose: bool):
    base = build_dir()
    if _find_library(base):
        try:
            return _import_built(base)
        except Exception:  # a stale or half-written cache: rebuild below
            pass
    if not (shutil.which(os.environ.get("CXX", "c++")) or shutil.which("g++")):
        raise KernelBuildError("no C++ compiler found (install g++ to build fd's CPU kernels)")
    try:
        base.mkdir(parents=True, exist_ok=True)
        lock = open(base / ".lock", "w")  # noqa: SIM115 - closed by the with below
    except OSError as exc:
        raise KernelBuildError(f"cannot write the kernel cache {base} ({exc}); set FD_KERNELS_CACHE") from exc
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another process may be building this very key
        try:
            if _find_library(base):
                return _import_built(base)
            return _build(base, verbose)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _build(base: Path, verbose: bool):
    from paddle.utils.cpp_extension import load as cpp_load  # noqa: PLC0415

    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            return cpp_load(
                name=MODULE_NAME,
                sources=_sources(),
                extra_cxx_cflags=list(CXX_FLAGS),
                extra_ldflags=_ld_flags(),
                extra_include_paths=[str(CSRC)],
                build_directory=str(base),
                verbose=verbose,
            )
    except Exception as exc:
        tail = (out.getvalue() + str(exc)).strip().splitlines()[-15:]
        raise KernelBuildError("building fd's C++ kernels failed:\n" + "\n".join(tail)) from exc
