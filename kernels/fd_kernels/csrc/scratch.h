// Scratch arrays of the decoder stack's steps: one allocation per array per call.
#pragma once
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <new>

namespace fdk {

struct FreeDeleter {
  void operator()(float* p) const { std::free(p); }
};

using Scratch = std::unique_ptr<float[], FreeDeleter>;

// Uninitialized, 64-byte aligned: a 512-token prefill needs ~18 MB of scratch, not worth zeroing.
inline Scratch scratch(int64_t floats) {
  const size_t bytes = ((size_t)(floats > 0 ? floats : 1) * sizeof(float) + 63) / 64 * 64;
  float* p = static_cast<float*>(std::aligned_alloc(64, bytes));
  if (!p) throw std::bad_alloc();
  return Scratch(p);
}

}  // namespace fdk
