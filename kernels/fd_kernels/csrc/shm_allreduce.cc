// Shared-memory collectives for the tensor-parallel ranks of one host (fdcli_engine/distributed/shm.py
// drives them through ctypes; plain C entry points, no Paddle types).
//
// One POSIX shared-memory segment per group: a header with one sequence counter per rank, then one
// slot of `slot_bytes` per rank. Every collective is a series of rounds, one per chunk of at most a
// slot. In round k a rank
//   1. waits until every counter is >= 2(k-1): every rank has finished reading round k-1, so its slot
//      may be overwritten (this wait is the "second barrier" of round k-1, paid lazily here so that it
//      overlaps with whatever the caller computed in between);
//   2. copies its chunk into its slot and stores 2k-1 in its counter (release);
//   3. waits until every counter is >= 2k-1 (acquire): every slot holds round k's data;
//   4. reads the slots (the all-reduce sums them in rank order, in fp32, so every rank computes the
//      same bits: ((s0 + s1) + s2) + ...; the all-gather copies them out) and stores 2k.
// A counter can never run more than one round ahead of the slowest rank, so ">=" comparisons suffice.
// Waits spin, then yield, then sleep in short steps; each gives up at the caller's deadline, or as soon
// as the awaited rank's process is gone, reporting which rank it was.

#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <new>

namespace {

constexpr uint64_t kMagic = 0x66645f7470636f6dULL;  // "fd_tpcom"
constexpr int kMaxRanks = 64;
constexpr int64_t kHeaderBytes = 8192;  // the header below, rounded up to whole pages

struct alignas(64) RankCtl {
  std::atomic<uint64_t> seq;  // 2k-1: round k's data is in the slot; 2k: done reading round k
  std::atomic<int64_t> pid;   // the attached process, so that a waiter notices it died
};

struct Header {
  std::atomic<uint64_t> magic;  // written last by the creator: the rest is valid once it is kMagic
  uint64_t nonce;               // the creator's random id, which the attaching ranks check
  int32_t world;
  int32_t unused;
  int64_t slot_bytes;
  RankCtl ctl[kMaxRanks];
};
static_assert(sizeof(Header) <= kHeaderBytes, "header outgrew its pages");
static_assert(std::atomic<uint64_t>::is_always_lock_free, "counters must be lock-free to be shared");

struct Group {
  char* base;
  int64_t map_bytes;
  int32_t rank;
  int32_t world;
  int64_t slot_bytes;
  uint64_t rounds;  // rounds this rank has completed
  Header* header() const { return reinterpret_cast<Header*>(base); }
  char* slot(int r) const { return base + kHeaderBytes + r * slot_bytes; }
};

enum Status : int32_t { kOk = 0, kTimeout = 1, kDead = 2 };

double now_s() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

void set_error(char* err, int64_t len, const char* what, const char* name) {
  if (err && len > 0) snprintf(err, len, "%s %s: %s", what, name, strerror(errno));
}

// POSIX shared memory as Linux implements it: files under /dev/shm. open() rather than shm_open()
// because glibc before 2.34 keeps shm_open in librt, which the kernel library does not link.
int open_segment(const char* name, int flags) {
  char path[320];
  if (snprintf(path, sizeof(path), "/dev/shm/%s", name[0] == '/' ? name + 1 : name) >= (int)sizeof(path)) {
    errno = ENAMETOOLONG;
    return -1;
  }
  return open(path, flags | O_CLOEXEC, 0600);
}

int unlink_segment(const char* name) {
  char path[320];
  snprintf(path, sizeof(path), "/dev/shm/%s", name[0] == '/' ? name + 1 : name);
  return unlink(path);
}

// A process that exited, or that died and awaits its parent's wait() (a zombie still answers kill 0).
bool process_gone(int64_t pid) {
  if (pid <= 0) return false;
  if (kill(static_cast<pid_t>(pid), 0) != 0) return errno == ESRCH;
  char path[64], buf[512];
  snprintf(path, sizeof(path), "/proc/%lld/stat", static_cast<long long>(pid));
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  ssize_t n = read(fd, buf, sizeof(buf) - 1);
  close(fd);
  if (n <= 0) return false;
  buf[n] = 0;
  const char* paren = strrchr(buf, ')');  // "pid (comm) S ...": comm may itself hold spaces or ')'
  return paren && paren[1] == ' ' && (paren[2] == 'Z' || paren[2] == 'X');
}

// Wait until every rank's counter is >= target; on failure *who is the rank waited for.
int32_t wait_all(const Group* g, uint64_t target, double deadline, int32_t* who) {
  Header* h = g->header();
  for (int r = 0; r < g->world; ++r) {
    std::atomic<uint64_t>& seq = h->ctl[r].seq;
    uint64_t spins = 0;
    double start = 0, next_check = 0;
    while (seq.load(std::memory_order_acquire) < target) {
      ++spins;
      // The common case: the other rank is a few microseconds behind. A plain load loop, no PAUSE:
      // under a hypervisor a PAUSE loop triggers pause-loop exiting, which deschedules the vCPU for
      // far longer than the wait itself.
      if (spins < 10000) continue;
      if ((spins & 63) != 0) {
        sched_yield();
        continue;
      }
      double t = now_s();
      if (start == 0) start = next_check = t;
      if (t >= next_check) {
        next_check = t + 0.05;
        if (process_gone(h->ctl[r].pid.load(std::memory_order_relaxed))) {
          *who = r;
          return kDead;
        }
      }
      if (t > deadline) {
        *who = r;
        return kTimeout;
      }
      if (t - start > 0.002) {  // a long wait (the other rank computes): stop burning its core,
        // and after a while longer (a rank idles or is stuck) wake up rarely
        timespec pause = {0, t - start > 0.1 ? 500000 : 20000};
        nanosleep(&pause, nullptr);
      }
    }
  }
  return kOk;
}

// Steps 1-3 of a round (see the file comment); `fill` writes this rank's slot.
template <typename Fill>
int32_t begin_round(Group* g, double deadline, int32_t* who, Fill fill) {
  uint64_t k = g->rounds + 1;
  int32_t st = wait_all(g, 2 * (k - 1), deadline, who);
  if (st != kOk) return st;
  fill(g->slot(g->rank));
  g->header()->ctl[g->rank].seq.store(2 * k - 1, std::memory_order_release);
  return wait_all(g, 2 * k - 1, deadline, who);
}

void end_round(Group* g) {
  g->rounds += 1;
  g->header()->ctl[g->rank].seq.store(2 * g->rounds, std::memory_order_release);
}

void sum_slots(const Group* g, float* out, int64_t n) {
  const float* s0 = reinterpret_cast<const float*>(g->slot(0));
  const float* s1 = reinterpret_cast<const float*>(g->slot(1));
  for (int64_t i = 0; i < n; ++i) out[i] = s0[i] + s1[i];
  for (int r = 2; r < g->world; ++r) {
    const float* s = reinterpret_cast<const float*>(g->slot(r));
    for (int64_t i = 0; i < n; ++i) out[i] += s[i];
  }
}

Group* map_group(int fd, int64_t bytes, int32_t rank, char* err, int64_t len, const char* name) {
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    set_error(err, len, "cannot map", name);
    return nullptr;
  }
  Group* g = new (std::nothrow) Group();
  if (!g) {
    munmap(p, bytes);
    return nullptr;
  }
  g->base = static_cast<char*>(p);
  g->map_bytes = bytes;
  g->rank = rank;
  return g;
}

}  // namespace

extern "C" {

int64_t fd_shm_header_bytes() { return kHeaderBytes; }
int32_t fd_shm_max_ranks() { return kMaxRanks; }

int32_t fd_shm_unlink(const char* name) { return unlink_segment(name) == 0 || errno == ENOENT ? 0 : -1; }

// Rank 0: create the segment afresh (a stale one of the same name, left by a killed group, is removed
// first). Returns the group, or null with `err` set.
void* fd_shm_create(const char* name, int32_t world, int64_t slot_bytes, uint64_t nonce, char* err,
                    int64_t len) {
  if (world < 2 || world > kMaxRanks || slot_bytes < 64 || slot_bytes % 64 != 0) {
    if (err && len > 0) snprintf(err, len, "bad shared-memory group shape (%d ranks, %lld-byte slots)",
                                 world, static_cast<long long>(slot_bytes));
    return nullptr;
  }
  unlink_segment(name);
  int fd = open_segment(name, O_CREAT | O_EXCL | O_RDWR);
  if (fd < 0) {
    set_error(err, len, "cannot create shared memory", name);
    return nullptr;
  }
  int64_t bytes = kHeaderBytes + world * slot_bytes;
  if (ftruncate(fd, bytes) != 0) {
    set_error(err, len, "cannot size shared memory", name);
    close(fd);
    unlink_segment(name);
    return nullptr;
  }
  Group* g = map_group(fd, bytes, 0, err, len, name);
  close(fd);
  if (!g) {
    unlink_segment(name);
    return nullptr;
  }
  g->world = world;
  g->slot_bytes = slot_bytes;
  Header* h = g->header();  // ftruncate zero-filled it: every counter starts at 0
  h->nonce = nonce;
  h->world = world;
  h->slot_bytes = slot_bytes;
  h->ctl[0].pid.store(getpid(), std::memory_order_relaxed);
  h->magic.store(kMagic, std::memory_order_release);
  return g;
}

// Ranks 1..: attach to the segment rank 0 created with `nonce`. Null with `err` set on failure.
void* fd_shm_attach(const char* name, int32_t rank, int32_t world, uint64_t nonce, char* err, int64_t len) {
  int fd = open_segment(name, O_RDWR);
  if (fd < 0) {
    set_error(err, len, "cannot open shared memory", name);
    return nullptr;
  }
  struct stat st;
  if (fstat(fd, &st) != 0 || st.st_size < kHeaderBytes) {
    if (err && len > 0) snprintf(err, len, "shared memory %s is not a group's segment", name);
    close(fd);
    return nullptr;
  }
  Group* g = map_group(fd, st.st_size, rank, err, len, name);
  close(fd);
  if (!g) return nullptr;
  Header* h = g->header();
  bool ok = h->magic.load(std::memory_order_acquire) == kMagic && h->nonce == nonce && h->world == world &&
            rank > 0 && rank < world && kHeaderBytes + world * h->slot_bytes <= st.st_size;
  if (!ok) {
    if (err && len > 0) snprintf(err, len, "shared memory %s belongs to another group", name);
    munmap(g->base, g->map_bytes);
    delete g;
    return nullptr;
  }
  g->world = world;
  g->slot_bytes = h->slot_bytes;
  h->ctl[rank].pid.store(getpid(), std::memory_order_relaxed);
  return g;
}

void fd_shm_close(void* handle) {
  Group* g = static_cast<Group*>(handle);
  if (!g) return;
  munmap(g->base, g->map_bytes);
  delete g;
}

// out[i] = sum over ranks, in rank order, of in[i] (fp32). `out` may be `in`. Returns a Status; on
// failure who[0] is the rank that did not arrive.
int32_t fd_shm_all_reduce_f32(void* handle, const float* in, float* out, int64_t n, double timeout_s,
                              int32_t* who) {
  Group* g = static_cast<Group*>(handle);
  double deadline = now_s() + timeout_s;
  const int64_t chunk = g->slot_bytes / static_cast<int64_t>(sizeof(float));
  for (int64_t off = 0; off < n; off += chunk) {
    const int64_t m = n - off < chunk ? n - off : chunk;
    int32_t st = begin_round(g, deadline, who, [&](char* slot) { memcpy(slot, in + off, m * sizeof(float)); });
    if (st != kOk) return st;
    sum_slots(g, out + off, m);
    end_round(g);
  }
  return kOk;
}

// out = every rank's `nbytes` of `in`, rank after rank (out holds world * nbytes).
int32_t fd_shm_all_gather(void* handle, const char* in, char* out, int64_t nbytes, double timeout_s,
                          int32_t* who) {
  Group* g = static_cast<Group*>(handle);
  double deadline = now_s() + timeout_s;
  for (int64_t off = 0; off < nbytes; off += g->slot_bytes) {
    const int64_t m = nbytes - off < g->slot_bytes ? nbytes - off : g->slot_bytes;
    int32_t st = begin_round(g, deadline, who, [&](char* slot) { memcpy(slot, in + off, m); });
    if (st != kOk) return st;
    for (int r = 0; r < g->world; ++r) memcpy(out + r * nbytes + off, g->slot(r), m);
    end_round(g);
  }
  return kOk;
}

int32_t fd_shm_barrier(void* handle, double timeout_s, int32_t* who) {
  Group* g = static_cast<Group*>(handle);
  int32_t st = begin_round(g, now_s() + timeout_s, who, [](char*) {});
  if (st == kOk) end_round(g);
  return st;
}

}  // extern "C"
