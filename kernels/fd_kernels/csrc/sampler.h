// Raw-pointer interface of the fused sampler (sampler_impl.h, instantiated per ISA in sampler.cc; Paddle
// glue in sampler_ops.cc). Semantics are those of fd_kernels/reference/sampler.py, the oracle.
// The enums mirror fd_kernels/sampler_layout.py (PARAM_COLUMNS, META_COLUMNS): same columns, same
// order, each name k + the column in CamelCase (tests/kernels/test_sampler_layout.py checks it).
#pragma once
#include <cstdint>

namespace fdk {

// Columns of the per-row parameter matrix (float64, so penalties are applied with the request's exact
// values, as numpy does).
enum SampleParam {
  kTemperature = 0,    // 0: greedy (argmax after penalties and bans)
  kTopK,               // 0: off
  kTopP,               // 1: off
  kMinP,               // 0: off
  kRepetitionPenalty,  // 1: off; over the prompt's and the output's distinct tokens
  kPresencePenalty,    // over the output's distinct tokens
  kFrequencyPenalty,   // times each token's count in the output
  kNumSampleParams
};

// Columns of the per-row id layout: the row's ids are ids[offset .. offset + n_prompt + n_output +
// n_banned), in that order (prompt ids, output ids, banned ids). Ids outside [0, vocab) are ignored.
enum SampleMeta { kOffset = 0, kNumPrompt, kNumOutput, kNumBanned, kNumSampleMeta };

struct SampleArgs {
  const float* logits;  // [rows, vocab]; not modified
  int64_t rows, vocab;
  const double* params;    // [rows, kNumSampleParams]
  const int64_t* ids;      // see SampleMeta
  const int64_t* meta;     // [rows, kNumSampleMeta]
  const double* uniforms;  // [rows, num_uniforms] in [0, 1)
  int64_t num_uniforms;    // 1 for the exact sampler; tries + 1 for rejection
  bool rejection;
  int64_t* out;  // [rows] sampled token ids
};

void sample(const SampleArgs& a);

}  // namespace fdk
