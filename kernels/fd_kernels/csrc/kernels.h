// Raw-pointer kernel interface shared by the ISA-specific implementations (kern_impl.h, instantiated in
// kernels.cc) and the Paddle glue (ops.cc). Nothing here knows about Paddle.
#pragma once
#include <cstdint>

namespace fdk {

// Packed weights come in panels of kNR output columns; columns past `n` in the last panel are zero.
constexpr int kNR = 32;

// Weight encodings inside a panel (per k, kNR values):
//   kF32: float[kNR]
//   kS8:  int8[kNR], value = scale * q
//   kU4:  uint8[kNR / 2]; byte j holds column j (low nibble) and column j + 16 (high nibble);
//         value = scale * q + min
// scales / mins are float[panels][groups][kNR]: one pair per (column, group of `group` k's).
enum WeightKind { kF32 = 0, kS8 = 1, kU4 = 2 };

struct GemmArgs {
  const float* a;  // [m, lda] row-major activations
  int64_t lda, m, k, n;
  const void* w;  // packed panels
  const float* scales;
  const float* mins;
  int64_t group;  // k's per scale group (ignored for kF32)
  int kind;
  const float* bias;  // padded to panels * kNR, or nullptr
  float* c;           // [m, n]
  // Set by gemm() for prompt rows on the AMX level (kS8/kU4): the AVX-512 microkernel rounds the
  // dequantized weights to bf16 (the activations arrive rounded), as amx.cc does. Never set by callers.
  bool bf16 = false;
};

struct AttnArgs {
  const float* q;        // [T, nh, hd]
  const void* k_cache;   // [nb, nkv, bs, hd]: float, or int8 codes when k_scales is set (C8)
  const void* v_cache;
  const int64_t* query_start_loc;  // [B + 1]
  const int64_t* seq_lens;         // [B]
  const int64_t* block_tables;     // [B, max_blocks]
  int64_t num_seqs, max_blocks, num_heads, num_kv_heads, block_size, head_dim;
  float scale;
  float* out;  // [T, nh, hd]
  // C8 cache (c8_impl.h): per-row scales [nb, nkv, bs]; nullptr for an fp32 cache.
  const float* k_scales = nullptr;
  const float* v_scales = nullptr;
};

// 3 = AVX-512 + AMX-BF16 (weight-only quantized linears compute in bf16, see amx.cc), 2 = AVX-512,
// 1 = AVX2+FMA, 0 = scalar: the best the CPU supports, lowered by FD_KERNELS_ISA.
int active_isa();

namespace amx {
bool usable();                       // CPU has AMX-BF16 and the OS granted the tile state
void gemm_bf16(const GemmArgs& g);   // kS8 / kU4 weights, any m
// a [m, lda] -> out [m, k]: each value rounded to bf16 (as amx.cc rounds), kept as fp32.
void round_rows_bf16(const float* a, int64_t m, int64_t k, int64_t lda, float* out);
}  // namespace amx

// prompt_rows (uint8 [m], may be null) marks the rows of prompt tokens. On the AMX level, quantized
// weights compute those rows in bf16 (amx.cc) and every other row in fp32, so a token's numerics depend on
// what it is, never on which requests share its batch. Elsewhere it is ignored.
void gemm(const GemmArgs& g, const uint8_t* prompt_rows = nullptr);
void rms_norm(const float* x, const float* w, float eps, int64_t t, int64_t h, float* out);
void fused_add_rms_norm(const float* x, const float* res, const float* w, float eps, int64_t t, int64_t h,
                        float* out, float* res_out);
void silu_and_mul(const float* x, int64_t t, int64_t i, float* out);
// q / k rows (one token's heads, contiguous) start q_stride / k_stride floats apart.
void rotary_embedding(const int64_t* pos, float* q, float* k, const float* cos_sin, int64_t t, int64_t nh,
                      int64_t nkv, int64_t hd, int64_t q_stride, int64_t k_stride);
void reshape_and_cache(const float* k, const float* v, float* kc, float* vc, const int64_t* slots, int64_t t,
                       int64_t nkv, int64_t bs, int64_t hd);
// C8: quantizes each (token, head) row of k / v into int8 codes kc / vc and scales ks / vs [nb, nkv, bs].
void reshape_and_cache_s8(const float* k, const float* v, int8_t* kc, int8_t* vc, float* ks, float* vs,
                          const int64_t* slots, int64_t t, int64_t nkv, int64_t bs, int64_t hd);
void paged_attention(const AttnArgs& a);

}  // namespace fdk
