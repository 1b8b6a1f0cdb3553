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
import os
import shutil
import sys
import tempfile
import warnings
from pathlib import Path

from fd_kernels.errors import KernelBuildError

MODULE_NAME = "fd_kernels_ext"
CSRC = Path(__file__).resolve().parent / "csrc"

# Portable baseline; the AVX2 and AVX-512 paths are compiled per namespace with target pragmas and
# picked at run time (csrc/kernels.cc), so the cached library also runs on older x86-64 CPUs.
CXX_FLAGS = ["-O3", "-std=c++17", "-march=x86-64-v2", "-fopenmp", "-fno-math-errno", "-Wno-unused-function"]


def _paddle_libs() -> str:
    import paddle  # noqa: PLC0415

    return os.path.join(os.path.dirname(paddle.__file__), "libs")


def _ld_flags() -> list[str]:
    # OpenMP from Paddle's bundled libiomp5 (it also provides the GOMP_* entry points GCC emits): two
    # OpenMP runtimes in one process compete for the cores (docs/kernels-measurements.md).
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
    path = base / MODULE_NAME / f"{MODULE_NAME}.so"
    return str(path) if path.exists() else None


def _cpp_extension():
    # Importing it warns "No ccache found" on every start; fd caches whole builds, ccache would not help.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from paddle.utils import cpp_extension  # noqa: PLC0415
        from paddle.utils.cpp_extension import extension_utils  # noqa: PLC0415
    return cpp_extension, extension_utils


def _register(library: str) -> tuple[str, ...]:
    """Register the library's ops with Paddle. No generated Python module is needed: fd_kernels.native calls
    Paddle's custom-op entry point by name."""
    return tuple(_cpp_extension()[1].load_op_meta_info_and_register_op(library))


_loaded: tuple[str, ...] | None = None  # Paddle registers custom ops once per process


def load(verbose: bool = False) -> tuple[str, ...]:
    """Build (first time) or load the cached library and register its ops; returns their names.
    Raises KernelBuildError on failure."""
    global _loaded
    if _loaded is None:
        _loaded = _load(verbose)
    return _loaded


def is_built() -> bool:
    """Whether the library for these sources, flags and versions is in the cache already (so `load()`
    only imports it, without compiling)."""
    return _find_library(build_dir()) is not None


def library_path() -> str:
    """The shared library `load()` registered (its plain C entry points are called through ctypes)."""
    load()
    library = _find_library(build_dir())
    if library is None:
        raise KernelBuildError(f"the kernel library vanished from {build_dir()}")
    return library


def _load(verbose: bool) -> tuple[str, ...]:
    base = build_dir()
    library = _find_library(base)
    if library:
        try:
            return _register(library)
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
            library = _find_library(base)
            return _register(library) if library else _build(base, verbose)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


@contextlib.contextmanager
def _captured_output(log):
    """Route fds 1 and 2 (the compiler subprocess inherits them) and sys.stdout/err into `log`: a first
    build must not spray setuptools and g++ chatter over a CLI's output."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    try:
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
        with contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
            yield
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        os.close(saved[0])
        os.close(saved[1])


def _build(base: Path, verbose: bool) -> tuple[str, ...]:
    cpp_load = _cpp_extension()[0].load
    log = tempfile.TemporaryFile(mode="w+")
    try:
        with _captured_output(log):
            module = cpp_load(
                name=MODULE_NAME,
                sources=_sources(),
                extra_cxx_cflags=list(CXX_FLAGS),
                extra_ldflags=_ld_flags(),
                extra_include_paths=[str(CSRC)],
                build_directory=str(base),
                verbose=verbose,
            )
    except Exception as exc:
        log.seek(0)
        tail = (log.read() + str(exc)).strip().splitlines()[-15:]
        raise KernelBuildError("building fd's C++ kernels failed:\n" + "\n".join(tail)) from exc
    finally:
        log.close()
    return tuple(name for name in dir(module) if name.startswith("fd_"))
