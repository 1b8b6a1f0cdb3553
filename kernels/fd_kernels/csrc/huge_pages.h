// Transparent huge pages (2 MB) for buffers the kernels stream: one place for the advice fd gives.
#pragma once
#include <cstdint>

namespace fdk {

// Ask for huge pages on the 2 MB-aligned interior of a fresh buffer, before its pages are first touched
// (a large op output: output_blocks.cc). Advice only: contents never change, and a mapping the kernel
// cannot back with huge pages keeps small ones.
void advise_huge_pages(void* p, int64_t bytes);

}  // namespace fdk

// Huge pages for every 2 MB page that overlaps [begin, end): MADV_HUGEPAGE, then for memory already
// written (weights after load) the synchronous MADV_COLLAPSE, which copies it onto huge pages now. Memory
// not touched yet (a KV cache before its zero fill) needs only the advice: its first touch faults 2 MB
// pages in. Rounds outward, since the weights of a small model are many buffers under 2 MB each laid
// side by side; a 2 MB page that also holds a neighbour's bytes is just as correct. Returns the bytes
// collapsed (or advised, without `collapse`); 0 where the kernel refuses (THP "never", no
// MADV_COLLAPSE, a page crossing a mapping's end).
extern "C" int64_t fd_huge_pages(uintptr_t begin, uintptr_t end, int32_t collapse);
