// Contiguous work ranges with stealing: items 0..n split into one range per thread, each walked front to
// back by its owner; a thread whose range is empty takes items from the back of the others'. Owners thus
// read memory in long sequential runs (the hardware prefetchers' case), while a thread the OS preempts
// still only delays the items it has not yet claimed.
#pragma once
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>

namespace fdk {

// n >= 1 items in the fewest blocks of at most `most` items, sized as evenly as possible, the larger blocks
// first (13 items, at most 5 -> 5 + 4 + 4): a short last block would run a latency-bound kernel alone.
struct BalancedBlocks {
  int64_t count, base, extra;
  BalancedBlocks(int64_t n, int64_t most) : count((n + most - 1) / most), base(n / count), extra(n % count) {}
  int64_t size(int64_t i) const { return base + (i < extra); }
};

class StealRanges {
 public:
  // Created outside the parallel region, for up to omp_get_max_threads() threads.
  explicit StealRanges(int64_t n) : nr_(std::max(1, omp_get_max_threads())), r_(new Range[nr_]) { reset(n); }
  // Items 0..n afresh. While no thread calls next(): inside a region, between two barriers that every
  // user of the previous items has passed and every user of the new ones will pass.
  void reset(int64_t n) {
    for (int i = 0; i < nr_; ++i) {
      const uint64_t lo = (uint64_t)(n * i / nr_), hi = (uint64_t)(n * (i + 1) / nr_);
      r_[i].fb.store(lo | hi << 32, std::memory_order_relaxed);
    }
  }
  // The calling thread's next item, or -1 when every range is empty. Inside the parallel region.
  int64_t next() {
    const int t = omp_get_thread_num() % nr_;
    int64_t i = take(r_[t], false);
    for (int s = 1; i < 0 && s < nr_; ++s) i = take(r_[(t + s) % nr_], true);
    return i;
  }

 private:
  struct alignas(64) Range {
    std::atomic<uint64_t> fb;  // front (next item) in the low 32 bits, back (one past the last) in the high
  };
  static int64_t take(Range& r, bool from_back) {
    uint64_t v = r.fb.load(std::memory_order_relaxed);
    for (;;) {
      const uint64_t f = v & 0xFFFFFFFFu, b = v >> 32;
      if (f >= b) return -1;
      const uint64_t nv = from_back ? v - (1ull << 32) : v + 1;
      if (r.fb.compare_exchange_weak(v, nv, std::memory_order_relaxed)) return (int64_t)(from_back ? b - 1 : f);
    }
  }
  int nr_;
  std::unique_ptr<Range[]> r_;
};

// Items 0..n handed out from one shared counter in runs, a run being a share of the items left (left / div,
// at least one) so that the runs shrink to single items near the end; each claim is a locked add on a line
// the other threads write, which also waits for the thread's own pending stores, hence runs rather than
// single items. A thread claims its next run as its current run's last item starts, so every item but the
// thread's last knows the item this thread takes after it (following()). Made by each thread of a
// parallel region over the same counter, which is 0 at the region's start.
class ItemRuns {
 public:
  ItemRuns(std::atomic<int64_t>& counter, int64_t n, int64_t div) : c_(counter), n_(n), div_(div) {
    claim(cur_, end_);
    --cur_;  // next() steps onto the run's first item
  }
  // The thread's next item, or n when none is left.
  int64_t next() {
    if (++cur_ == end_) cur_ = cur2_, end_ = end2_;
    if (cur_ >= n_) return n_;
    if (cur_ + 1 == end_) claim(cur2_, end2_);
    return cur_;
  }
  // The item this thread takes after next()'s, or n when none is known.
  int64_t following() const { return cur_ + 1 < end_ ? cur_ + 1 : cur2_; }

 private:
  void claim(int64_t& b0, int64_t& b1) {
    const int64_t take = std::max<int64_t>(1, (n_ - c_.load(std::memory_order_relaxed)) / div_);
    b0 = c_.fetch_add(take, std::memory_order_relaxed);
    b1 = std::min(n_, b0 + take);
  }
  std::atomic<int64_t>& c_;
  const int64_t n_, div_;
  int64_t cur_, end_, cur2_ = n_, end2_ = n_;  // the current run [cur_, end_) and the one claimed after it
};

}  // namespace fdk
