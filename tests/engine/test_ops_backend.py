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
