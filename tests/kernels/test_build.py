"""Build system: cache reuse, the clear error without a compiler, and the ISA switch."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from fd_kernels import build
from fd_kernels.errors import KernelBuildError


def test_cached_build_is_imported_without_compiling(native):
    # The session fixture built (or found) the library; a fresh process must import it, not compile.
    assert build._find_library(build.build_dir())
    code = (
        "from fd_kernels import build\n"
        "def no_build(*a, **k): raise SystemExit('rebuilt although the cache exists')\n"
        "build._build = no_build\n"
        "m = build.load()\n"
        "assert m is build.load() and 'fd_linear' in m\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_cache_key_tracks_sources(monkeypatch, tmp_path):
    key = build.cache_key()
    assert key == build.cache_key()
    fake = tmp_path / "csrc"
    fake.mkdir()
    (fake / "a.cc").write_text("int x;")
    monkeypatch.setattr(build, "CSRC", fake)
    assert build.cache_key() != key


def test_missing_compiler_is_a_kernel_build_error(monkeypatch, tmp_path):
    monkeypatch.setattr(build, "_loaded", None)
    monkeypatch.setenv("FD_KERNELS_CACHE", str(tmp_path))  # empty cache: a build would be needed
    monkeypatch.setattr(build.shutil, "which", lambda name: None)
    with pytest.raises(KernelBuildError, match="no C\\+\\+ compiler"):
        build.load()


def test_active_isa_follows_env(native):
    want = os.environ.get("FD_KERNELS_ISA")
    isa = native.active_isa()
    assert isa in native.ISA_NAMES.values()
    if want:
        assert isa == want


def test_openmp_entry_points_all_come_from_libiomp5(native):
    # Every GOMP_*/omp_* symbol the library imports must exist in Paddle's libiomp5; one that only
    # libgomp has (GCC's schedule(dynamic) -> GOMP_loop_nonmonotonic_*) would bind to libgomp at run time
    # and run the loop once per thread instead of splitting it.
    import shutil

    if not shutil.which("nm"):
        pytest.skip("nm (binutils) not installed")
    iomp = os.path.join(build._paddle_libs(), "libiomp5.so")
    if not os.path.exists(iomp):
        pytest.skip("this Paddle build bundles no libiomp5")

    def symbols(path, flag):
        out = subprocess.run(["nm", "-D", flag, path], capture_output=True, text=True, check=True).stdout
        return {line.split()[-1].split("@")[0] for line in out.splitlines() if line.strip()}

    wanted = {
        s
        for s in symbols(build._find_library(build.build_dir()), "--undefined-only")
        if s.startswith(("GOMP_", "omp_"))
    }
    assert wanted, "the kernels should use OpenMP"
    assert wanted <= symbols(iomp, "--defined-only")


def test_engine_op_table_binds_native_ops(native):
    from fdcli_engine import ops as engine_ops

    previous = engine_ops.backend
    try:
        assert engine_ops.use("native") == "native"
        for name in engine_ops.OP_NAMES:
            assert getattr(engine_ops, name) is getattr(native, name), name
    finally:
        engine_ops.use(previous)


def test_importing_the_kernels_first_still_gives_the_engine_native_ops(native):
    # fdcli_engine.ops binds fd_kernels.native when it is imported; fd_kernels must therefore never import
    # the engine, or importing it first (benchmarks, users' scripts) is a circular import that silently
    # leaves the whole process on the reference ops.
    code = "import fd_kernels.native\nimport fdcli_engine.ops as o\nprint(o.backend, o.decoder_stack is not None)\n"
    env = {k: v for k, v in os.environ.items() if k != "FD_KERNELS"}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["native", "True"], proc.stdout + proc.stderr[-2000:]
    assert "unavailable" not in proc.stderr


def test_unwritable_cache_is_a_kernel_build_error(monkeypatch, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    monkeypatch.setattr(build, "_loaded", None)
    monkeypatch.setenv("FD_KERNELS_CACHE", str(blocker / "sub"))  # a path below a regular file
    with pytest.raises(KernelBuildError, match="FD_KERNELS_CACHE"):
        build.load()
