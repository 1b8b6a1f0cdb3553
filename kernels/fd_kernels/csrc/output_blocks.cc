// One kept block for large op outputs (output_blocks.h).

#include "output_blocks.h"

#include <sys/mman.h>

#include <mutex>

#include "huge_pages.h"

namespace {

// Blocks larger than this are unmapped when freed: keeping one would hold that much memory for good.
constexpr int64_t kKeepMaxBytes = int64_t{256} << 20;

std::mutex mu;
void* kept = nullptr;  // guarded by mu
int64_t kept_bytes = 0;

void release(void* p, int64_t bytes) {
  if (bytes <= kKeepMaxBytes) {
    std::lock_guard<std::mutex> lock(mu);
    std::swap(p, kept);
    std::swap(bytes, kept_bytes);
  }
  if (p) munmap(p, bytes);
}

// A block of `bytes`: the kept one when it is that size or at most twice it, else a fresh mapping.
std::pair<void*, int64_t> acquire(int64_t bytes) {
  {
    std::lock_guard<std::mutex> lock(mu);
    if (kept && kept_bytes >= bytes && kept_bytes <= 2 * bytes) {
      std::pair<void*, int64_t> b{kept, kept_bytes};
      kept = nullptr;
      kept_bytes = 0;
      return b;
    }
  }
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  PD_CHECK(p != MAP_FAILED, "out of memory for a ", bytes, "-byte output");
  fdk::advise_huge_pages(p, bytes);
  return {p, bytes};
}

}  // namespace

paddle::Tensor fdk::output_block(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  const int64_t bytes = (n * (int64_t)sizeof(float) + 4095) / 4096 * 4096;
  const auto [p, size] = acquire(bytes);
  return paddle::from_blob(p, shape, paddle::DataType::FLOAT32, phi::DataLayout::NCHW, paddle::CPUPlace(),
                           [size = size](void* q) { release(q, size); });
}
