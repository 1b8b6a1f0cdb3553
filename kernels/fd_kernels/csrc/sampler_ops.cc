// Host entry point of the fused sampler, called from Python through ctypes (fd_kernels/native/sampler.py).
// The sampler reads and writes numpy arrays on the host, so it is not a Paddle operator: Paddle's op
// dispatch plus a zero-copy view per input would cost many times the work of a greedy row
// (docs/kernels-measurements.md). Python checks dtypes and shapes; this checks every row's id range, so the
// kernel never reads outside its inputs.

#include <cstdint>

#include "sampler.h"

// Returns -1 after sampling every row into `out`, or the first row whose ids lie outside `ids` (nothing
// is sampled then).
extern "C" int64_t fd_sample_host(const float* logits, int64_t rows, int64_t vocab, const double* params,
                                  const int64_t* ids, int64_t num_ids, const int64_t* meta,
                                  const double* uniforms, int64_t num_uniforms, int32_t rejection,
                                  int64_t* out) {
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t* mr = meta + r * fdk::kNumSampleMeta;
    const int64_t len = mr[fdk::kNumPrompt] + mr[fdk::kNumOutput] + mr[fdk::kNumBanned];
    if (mr[fdk::kOffset] < 0 || mr[fdk::kNumPrompt] < 0 || mr[fdk::kNumOutput] < 0 ||
        mr[fdk::kNumBanned] < 0 || mr[fdk::kOffset] + len > num_ids)
      return r;
  }
  const fdk::SampleArgs a{logits, rows, vocab, params, ids, meta, uniforms, num_uniforms, rejection != 0, out};
  if (rows) fdk::sample(a);
  return -1;
}
