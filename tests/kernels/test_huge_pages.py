"""fd_kernels' huge_pages op (csrc/huge_pages.cc through native/thp.py): a buffer it is given ends
up on 2 MB transparent huge pages, as /proc/self/smaps reports, with its contents unchanged; turned off
it does nothing; the reference does nothing."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def thp_mode() -> str | None:
    """The bracketed mode of the kernel's THP setting ("always", "madvise", "never"), None without THP."""
    try:
        return re.search(r"\[(\w+)\]", THP.read_text()).group(1)
    except (OSError, AttributeError):
        return None


def anon_huge_kb(addr: int) -> int:
    """AnonHugePages of the mapping of this process that holds `addr`."""
    inside = False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        m = re.match(r"^([0-9a-f]+)-([0-9a-f]+) ", line)
        if m:
            inside = int(m.group(1), 16) <= addr < int(m.group(2), 16)
        elif inside and line.startswith("AnonHugePages:"):
            return int(line.split()[1])
    raise AssertionError(f"no mapping holds {addr:#x}")


@pytest.fixture
def thp_allowed():
    mode = thp_mode()
    if mode in (None, "never"):
        pytest.skip(f"transparent huge pages are {mode or 'absent'} on this machine")


def test_a_buffer_is_collapsed_onto_huge_pages(native, thp_allowed, monkeypatch):
    import paddle

    monkeypatch.delenv("FD_HUGEPAGES", raising=False)
    values = np.arange(2 << 20, dtype=np.float32)  # 8 MB
    t = paddle.to_tensor(values)
    done = native.huge_pages([t])
    # At least the three 2 MB pages inside any 8 MB range; at most the five it can touch.
    assert 6 << 20 <= done <= 10 << 20
    assert done % (2 << 20) == 0
    middle = t.data_ptr() + (4 << 20)
    assert anon_huge_kb(middle) >= 2048
    np.testing.assert_array_equal(t.numpy(), values)


def test_turned_off_it_leaves_the_pages(native, monkeypatch):
    import paddle

    monkeypatch.setenv("FD_HUGEPAGES", "0")
    assert native.huge_pages([paddle.ones([2 << 20])]) == 0


def test_the_reference_does_nothing(ref):
    import paddle

    assert ref.huge_pages([paddle.ones([2 << 20])]) == 0


def test_ranges_closer_than_a_huge_page_are_joined():
    from fd_kernels.native.thp import HUGE, joined_ranges

    spans = [(5 * HUGE, 6 * HUGE), (0, 100), (100 + HUGE - 1, 2 * HUGE), (3 * HUGE + 1, 3 * HUGE + 1)]
    assert joined_ranges(spans) == [(0, 2 * HUGE), (5 * HUGE, 6 * HUGE)]
