// The decode region's barrier (decode_region.cc): a sense-reversing spin barrier whose waiting threads do a
// little work of their own per spin instead of only spinning, namely software prefetches of the weights
// they read first after the barrier (Prefetcher). An OpenMP barrier cannot run code while it waits.
#pragma once
#include <immintrin.h>
#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>

namespace fdk {

// Lines of [p, p + n) into L2, a few per step(), front to back; set() to a new range starts over.
class Prefetcher {
 public:
  void set(const char* p, int64_t n) {
    if (p == p_) return;  // the same range: keep going where the last wait stopped
    p_ = p;
    n_ = n;
    off_ = 0;
  }
  // Prefetches the next kLines lines; false once the whole range is issued. asm volatile: GCC 12 deletes a
  // loop of _mm_prefetch calls it deems free of side effects.
  bool step() {
    if (off_ >= n_) return false;
    const int64_t end = std::min(n_, off_ + kLines * 64);
    for (; off_ < end; off_ += 64) asm volatile("prefetcht1 %0" : : "m"(*(p_ + off_)));
    return true;
  }

 private:
  static constexpr int64_t kLines = 4;
  const char* p_ = nullptr;
  int64_t n_ = 0, off_ = 0;
};

// For the n threads of one parallel region. wait() returns once all n have called it; its writes before
// the call happen before every thread's reads after it (release on arrival, acquire on leaving).
class SpinBarrier {
 public:
  // By one thread, before the others' first wait() (e.g. before an omp barrier).
  void init(int n) {
    n_ = n;
    count_.store(0, std::memory_order_relaxed);
    flag_.store(0, std::memory_order_relaxed);
  }
  // sense: the calling thread's own, 0 before its first wait. idle(): called while waiting, returns false
  // when it has nothing left to do; then the thread pauses, and after kSpins pauses sleeps on a futex (as
  // an OpenMP barrier does after KMP_BLOCKTIME): where threads outnumber free cores, a spinning thread
  // would take the core of the one it waits for.
  template <class Idle>
  void wait(int& sense, Idle&& idle) {
    sense ^= 1;
    if (count_.fetch_add(1, std::memory_order_acq_rel) == n_ - 1) {
      count_.store(0, std::memory_order_relaxed);
      flag_.store(sense, std::memory_order_seq_cst);
      // seq_cst store then load, against sleep()'s increment then load: one of the two sees the other.
      if (sleepers_.load(std::memory_order_seq_cst) > 0) futex(FUTEX_WAKE_PRIVATE, INT32_MAX);
      return;
    }
    for (int64_t spins = 0; flag_.load(std::memory_order_acquire) != sense;) {
      if (idle()) continue;
      if (++spins < kSpins) {
        _mm_pause();
      } else {
        sleep(sense);
      }
    }
  }

 private:
  static constexpr int64_t kSpins = 1 << 11;
  void sleep(int sense) {
    sleepers_.fetch_add(1, std::memory_order_seq_cst);
    // Returns at once if flag_ is no longer 1 - sense; the timeout only bounds a lost wake-up.
    if (flag_.load(std::memory_order_seq_cst) != sense) {
      const timespec ts{0, 1000000};
      futex(FUTEX_WAIT_PRIVATE, 1 - sense, &ts);
    }
    sleepers_.fetch_sub(1, std::memory_order_seq_cst);
  }
  long futex(int op, int val, const timespec* ts = nullptr) {
    return syscall(SYS_futex, reinterpret_cast<int*>(&flag_), op, val, ts, nullptr, 0);
  }
  alignas(64) std::atomic<int> count_{0};
  alignas(64) std::atomic<int> flag_{0};
  alignas(64) std::atomic<int> sleepers_{0};
  int n_ = 1;
};

}  // namespace fdk
