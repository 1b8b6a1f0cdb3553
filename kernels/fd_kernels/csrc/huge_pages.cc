// Transparent huge page advice (huge_pages.h).

#include "huge_pages.h"

#include <sys/mman.h>

#ifndef MADV_COLLAPSE
#define MADV_COLLAPSE 25  // Linux 6.1; an older kernel answers EINVAL and the buffer keeps small pages
#endif

namespace {
constexpr uintptr_t kHuge = uintptr_t{2} << 20;
}  // namespace

void fdk::advise_huge_pages(void* p, int64_t bytes) {
  const uintptr_t b = ((uintptr_t)p + kHuge - 1) & ~(kHuge - 1), e = ((uintptr_t)p + bytes) & ~(kHuge - 1);
  if (e > b) madvise((void*)b, e - b, MADV_HUGEPAGE);
}

extern "C" int64_t fd_huge_pages(uintptr_t begin, uintptr_t end, int32_t collapse) {
  int64_t done = 0;
  // Page by page: one that fails (it crosses into another mapping, or the kernel has no huge page to
  // give) must not stop the others.
  for (uintptr_t a = begin & ~(kHuge - 1); a < end; a += kHuge) {
    if (madvise((void*)a, kHuge, MADV_HUGEPAGE) != 0) continue;
    if (!collapse || madvise((void*)a, kHuge, MADV_COLLAPSE) == 0) done += (int64_t)kHuge;
  }
  return done;
}
