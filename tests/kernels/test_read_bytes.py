"""fd_kernels.native.read_bytes, the roofline's "read once" (benchmarks/bench_decode_roofline.py): it must
read every byte of the buffer, each thread's share, the vector body and the tails alike."""

from __future__ import annotations

import numpy as np
import pytest


@pytest.mark.parametrize("size", [1, 63, 64, 255, 256, 257, 4096 + 17, 1 << 20])
def test_every_byte_is_read(native, size):
    buf = np.zeros(size, dtype=np.uint8)
    assert native.read_bytes(buf) == 0
    for pos in sorted({0, size // 3, size // 2, size - 129, size - 65, size - 2, size - 1}):
        if pos < 0:
            continue
        buf[pos] = 0x80
        assert native.read_bytes(buf) != 0, f"byte {pos} of {size} was not read"
        buf[pos] = 0


def test_an_unaligned_view_is_read(native):
    base = np.zeros(1000, dtype=np.uint8)
    base[999] = 1
    assert native.read_bytes(base[3:]) != 0
    assert native.read_bytes(base[3:999]) == 0


def test_a_strided_buffer_is_refused(native):
    with pytest.raises(ValueError, match="contiguous"):
        native.read_bytes(np.zeros(64, dtype=np.uint8)[::2])
