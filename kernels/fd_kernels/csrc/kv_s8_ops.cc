// Host entry points of the C8 row rule for KV offload's int8 tier (fd_kernels/native/kv_s8.py), called
// through ctypes on numpy arrays: an offloaded block lives in numpy, and a Paddle op would add its dispatch
// and a zero-copy view per input to every block (as sampler_ops.cc explains for the sampler). Python
// checks dtypes, shapes and contiguity; these only run the rule (c8_impl.h) at the active ISA.

#include <cstdint>

#include "kernels.h"

extern "C" void fd_kv_s8_quantize_host(const float* x, int64_t rows, int64_t hd, int8_t* q, float* s) {
  fdk::kv_s8_quantize(x, rows, hd, q, s);
}

extern "C" void fd_kv_s8_dequantize_host(const int8_t* q, const float* s, int64_t rows, int64_t hd, float* out) {
  fdk::kv_s8_dequantize(q, s, rows, hd, out);
}

extern "C" void fd_kv_s8_quantize_bf16_host(const uint16_t* x, int64_t rows, int64_t hd, int8_t* q, float* s) {
  fdk::kv_s8_quantize_bf16(x, rows, hd, q, s);
}

extern "C" void fd_kv_s8_dequantize_bf16_host(const int8_t* q, const float* s, int64_t rows, int64_t hd,
                                              uint16_t* out) {
  fdk::kv_s8_dequantize_bf16(q, s, rows, hd, out);
}
