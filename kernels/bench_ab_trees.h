// The two kernel trees of an A/B harness: bench_ab_tree.h instantiated as fdk::A (FD_A_IMPL, the saved
// kern_impl.h) and fdk::B (FD_B_IMPL, this tree's), and the bf16 rounding both harnesses fill caches with.
#pragma once
#include <cstdint>
#include <cstring>

#define FD_TREE_NS A
#define FD_TREE_IMPL FD_A_IMPL
#include "bench_ab_tree.h"
#undef FD_TREE_NS
#undef FD_TREE_IMPL
#define FD_TREE_NS B
#define FD_TREE_IMPL FD_B_IMPL
#include "bench_ab_tree.h"
#undef FD_TREE_NS
#undef FD_TREE_IMPL

// fp32 -> bf16, round to nearest even.
static uint16_t to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return (uint16_t)((u + 0x7FFF + ((u >> 16) & 1)) >> 16);
}
