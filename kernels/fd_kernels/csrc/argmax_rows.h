// Each row's first argmax over its columns, split over threads (csrc/lm_head_argmax.cc): the greedy token
// of linear_argmax and of the decode region's LM head (decode_region.cc), one rule for both.
#pragma once
#include <cstdint>
#include <vector>

namespace fdk {

// The first index of the largest value of a range (n >= 1), and whether any value is NaN (the index and
// value mean nothing then: the row's answer is -1 whatever they are). index -1: an empty range.
struct ArgMax {
  float best;
  int64_t index;
  bool nan;
};

// Thread t of nt's share of every row of c [m, n]: columns [n t / nt, n (t + 1) / nt), into part[r * nt + t].
void argmax_share(const float* c, int64_t m, int64_t n, int t, int nt, ArgMax* part);
// out[r]: row r's first argmax (ties to the lowest column) from its nt shares, or -1 where it holds a NaN.
// The same whatever nt: the shares are combined in column order, strictly greater replacing.
void argmax_combine(const ArgMax* part, int64_t m, int nt, int64_t* out);
// A logits buffer of `floats`: up to 16 MB one the calling thread keeps (a decode step writes into memory
// already mapped and cached), else `once`, freed by the caller.
float* logits_scratch(int64_t floats, std::vector<float>& once);

}  // namespace fdk
