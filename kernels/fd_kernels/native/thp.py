"""Weights and KV caches on transparent huge pages (csrc/huge_pages.cc through ctypes).

A decode step streams every weight and the KV cache: on 4 KB pages that is one TLB entry (and a page
walk) per 4 KB, and the L2 streamer stops at each 4 KB boundary. `huge_pages` backs the buffers it is
given with 2 MB pages in place (MADV_HUGEPAGE + MADV_COLLAPSE): the addresses and the bytes stay as
they are. A buffer not written yet (`touched=False`: a KV cache between `paddle.empty` and its zero
fill) only gets the advice, and its first touch faults huge pages in, which is cheaper than filling 4 KB
pages and copying them. The buffers of a small model lie side by side in the heap, most under 2 MB each, so ranges
closer than 2 MB are joined and every 2 MB page they touch is collapsed.

Advice only: where the kernel refuses (THP "never", a kernel before 6.1, no free huge page) the buffers
keep their small pages and nothing fails. FD_HUGEPAGES=0 turns it off.
"""

from __future__ import annotations

import ctypes
import os
import sys

from fd_kernels.build import library_path as _library_path

HUGE = 2 << 20
_fn = None  # the library's fd_huge_pages, bound on first use


def enabled() -> bool:
    return os.environ.get("FD_HUGEPAGES", "1") != "0" and sys.platform.startswith("linux")


def joined_ranges(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """[begin, end) byte ranges sorted, with ranges less than a huge page apart joined."""
    out: list[list[int]] = []
    for b, e in sorted(s for s in spans if s[1] > s[0]):
        if out and b - out[-1][1] < HUGE:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([b, e])
    return [(b, e) for b, e in out]


def huge_pages(tensors, touched: bool = True) -> int:
    """Back the memory of `tensors` (Paddle CPU tensors) with 2 MB pages; returns the bytes now on huge
    pages, or advised to be when not `touched` (0 when turned off or refused)."""
    global _fn
    if not enabled():
        return 0
    if _fn is None:
        fn = ctypes.CDLL(_library_path()).fd_huge_pages
        fn.argtypes = [ctypes.c_uint64, ctypes.c_uint64, ctypes.c_int32]
        fn.restype = ctypes.c_int64
        _fn = fn
    # Host memory only: a GPU build's device tensors have no pages for madvise to act on.
    host = [t for t in tensors if t.place.is_cpu_place()]
    spans = [(t.data_ptr(), t.data_ptr() + int(t.numel()) * t.element_size()) for t in host]
    return sum(int(_fn(b, e, int(touched))) for b, e in joined_ranges(spans))
