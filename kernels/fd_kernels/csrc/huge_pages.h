// Transparent huge pages (2 MB) for buffers the kernels stream: one place for the advice fd gives.
#pragma once
#include <cstdint>

namespace fdk {

// Ask for huge pages on the 2 MB-aligned interior of a fresh buffer of at least `min_bytes`, before its
// pages are first touched (a large op output). Advice only: contents never change, and a mapping the
// kernel cannot back with huge pages keeps small ones.
void advise_huge_pages(void* p, int64_t bytes, int64_t min_bytes);

}  // namespace fdk

// Back every 2 MB page that overlaps [begin, end) with a huge page now (MADV_HUGEPAGE, then the
// synchronous MADV_COLLAPSE), for buffers already written (weights after load, a zeroed KV cache).
// Rounds outward, since the weights of a small model are many buffers under 2 MB each laid side by side;
// a 2 MB page that also holds a neighbour's bytes is just as correct. Returns the bytes now on huge pages
// (0 where the kernel refuses: THP "never", no MADV_COLLAPSE, a page crossing a mapping's end).
extern "C" int64_t fd_collapse_huge_pages(uintptr_t begin, uintptr_t end);
