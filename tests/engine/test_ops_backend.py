"""ops.describe(): what the engine's "engine ready" log line reports as its kernels."""

from fdcli_engine import ops


def test_describe_names_the_bound_implementation_and_isa():
    from fd_kernels import native

    before = ops.backend
    try:
        ops.use("reference")
        assert ops.describe() == "reference"
        ops.use("native")
        assert native.active_isa() in {"amx", "avx512bf16", "avx512", "avx2", "scalar"}
        assert ops.describe() == f"native ({native.active_isa()})"
    finally:
        ops.use(before)


def test_a_first_build_is_announced(monkeypatch, tmp_path, caplog):
    """A first start compiles the kernels for about a minute: the engine says so before it starts."""
    import logging

    from fd_kernels import native

    native.load()  # built (or imported) into the default cache first
    monkeypatch.setattr(native, "load", lambda: ())  # the build itself is not what is tested here
    with caplog.at_level(logging.INFO, logger="fdcli_engine.ops"):
        assert ops._load_native() is native  # the cache in use holds the build: nothing to announce
        assert "building fd's C++ kernels" not in caplog.text
        monkeypatch.setenv("FD_KERNELS_CACHE", str(tmp_path))  # an empty cache
        assert ops._load_native() is native
    assert f"building fd's C++ kernels into {tmp_path}" in caplog.text


def test_an_unknown_forced_level_is_named(monkeypatch, caplog):
    import logging

    from fd_kernels import native

    native.load()
    with caplog.at_level(logging.WARNING, logger="fdcli_engine.ops"):
        monkeypatch.setenv("FD_KERNELS_ISA", "avx2")  # a level: nothing to say
        ops._load_native()
        assert "FD_KERNELS_ISA" not in caplog.text
        monkeypatch.setenv("FD_KERNELS_ISA", "avx512_bf16")  # a typo of avx512bf16
        ops._load_native()
    assert (
        "FD_KERNELS_ISA=avx512_bf16 is not a kernel level (use one of avx512bf16, avx512, avx2, scalar)"
        in caplog.text
    )
    assert f"running the CPU's best, {native.active_isa()}" in caplog.text
