"""runner/host_memory.zeros: Paddle tensors over a huge-page-advised mapping, equal to paddle.zeros."""

from __future__ import annotations

import numpy as np
import paddle
import pytest

from fdcli_engine.runner.host_memory import MIN_BYTES, zeros


def _mapping_of(addr: int) -> list[str]:
    """The /proc/self/smaps lines of the mapping that holds `addr`."""
    lines = open("/proc/self/smaps").read().splitlines()
    for i, line in enumerate(lines):
        head = line.split(" ", 1)[0]
        if "-" in head and all(c in "0123456789abcdef-" for c in head):
            lo, hi = (int(v, 16) for v in head.split("-"))
            if lo <= addr < hi:
                end = next(
                    (j for j in range(i + 1, len(lines)) if "-" in lines[j].split(" ", 1)[0]), len(lines)
                )
                return lines[i:end]
    raise AssertionError(f"no mapping holds {addr:#x}")


@pytest.mark.parametrize("dtype", ["float32", "int8", "bfloat16"])
@pytest.mark.parametrize("shape", [[64, 1, 16, 64], [700, 3, 16, 64]])  # below and above MIN_BYTES
def test_zeros_is_a_writable_contiguous_zero_tensor(dtype, shape):
    t = zeros(shape, dtype)
    assert t.dtype == getattr(paddle, dtype) and list(t.shape) == shape and t.is_contiguous()
    assert not t.astype("float32").abs().sum().item()
    t[3, 0, 5, 7] = 2.5 if dtype != "int8" else 3
    x = t.astype("float32").numpy()
    expected = np.zeros(shape, np.float32)
    expected[3, 0, 5, 7] = 2.5 if dtype != "int8" else 3
    np.testing.assert_array_equal(x, expected)


def test_large_buffers_are_advised_for_huge_pages():
    try:
        mode = open("/sys/kernel/mm/transparent_hugepage/enabled").read()
    except OSError:
        pytest.skip("this kernel has no transparent huge pages")
    if "[never]" in mode:
        pytest.skip("transparent huge pages are disabled on this machine")
    t = zeros([MIN_BYTES // 4 * 3], "float32")
    assert ["THPeligible:", "1"] in [line.split() for line in _mapping_of(t.data_ptr())]
    if "[madvise]" in mode:  # the control: without the advice Paddle's own buffer is not eligible
        plain = paddle.zeros([MIN_BYTES // 4 * 3], "float32")
        assert ["THPeligible:", "0"] in [line.split() for line in _mapping_of(plain.data_ptr())]
