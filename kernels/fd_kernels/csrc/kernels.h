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
//
// GGUF block kinds (qgemm.cc) keep the file's blocks: per column and block of kQBlock k's an fp16 scale d
// (and for Q4_1 an fp16 min m) and one code u per weight; value = d * (u - z) (Q4_0: z = 8, Q8_0: codes
// stored as q + 128, z = 128) or d * u + m (Q4_1). Their activations become 16-bit fixed point per row
// and block, multiplied as two int8 planes and summed in int32: see qgemm_impl.h.
enum WeightKind { kF32 = 0, kS8 = 1, kU4 = 2, kQ4_0 = 3, kQ4_1 = 4, kQ8_0 = 5 };

constexpr int kQNR = 16;          // columns per panel of a GGUF block kind (one zmm of int32 lanes)
constexpr int64_t kQBlock = 32;   // k's per block (GGUF's)
inline constexpr bool is_qkind(int kind) { return kind >= kQ4_0 && kind <= kQ8_0; }
// Bytes of one (panel, block) record: fp16 d[16], fp16 m[16] (Q4_1 only), then the codes: 4 chunks of 64
// bytes for 4-bit kinds (byte 4c+j of chunk i: column c, low nibble k = 8i+j, high nibble k = 8i+4+j) or 8
// chunks for Q8_0 (byte 4c+j of chunk i: column c, k = 4i+j), which is the operand layout of vpdpbusd.
inline constexpr int64_t q_record_bytes(int kind) {
  return 2 * kQNR + (kind == kQ4_1 ? 2 * kQNR : 0) + (kind == kQ8_0 ? kQBlock : kQBlock / 2) * kQNR;
}
inline constexpr int32_t q_zero(int kind) { return kind == kQ4_0 ? 8 : kind == kQ8_0 ? 128 : 0; }
inline constexpr int64_t q_codes_offset(int kind) { return 2 * kQNR * (kind == kQ4_1 ? 2 : 1); }
// Elements of the packed weight tensor (float for kF32, int8 for kS8, uint8 otherwise) for n outputs
// and k inputs; -1 when the kind cannot hold k inputs (GGUF kinds need whole blocks).
inline int64_t packed_elems(int kind, int64_t n, int64_t k) {
  if (is_qkind(kind)) return k % kQBlock ? -1 : (n + kQNR - 1) / kQNR * (k / kQBlock) * q_record_bytes(kind);
  return (n + kNR - 1) / kNR * k * (kind == kU4 ? kNR / 2 : kNR);
}

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
  // Set by gemm() for prompt rows on the bf16 levels (kS8/kU4): the AVX-512 microkernel rounds the
  // dequantized weights to bf16 (the activations arrive rounded), as amx.cc does. Never set by callers.
  bool bf16 = false;
  // The weight's bf16 tiles for the bf16 levels (amx::pack_tiles, made once at load), or nullptr: the
  // tiles are then dequantized per call. Either way the same numbers.
  const uint16_t* tiles = nullptr;
  // Optional, run once on every range [r0, r1) of c's rows after all their columns are written (the
  // decoder stack's residual add + RMSNorm on a projection's output). Where the bf16 tiles take every row
  // it runs inside the product's parallel region, each 32-row block by the thread that completes it, while
  // those rows are still in its cache; elsewhere gemm() runs it over all rows after the product. The
  // ranges never overlap, so it may run on several at once; it must compute each row from that row alone.
  void (*epilogue)(void* ctx, int64_t r0, int64_t r1) = nullptr;
  void* epilogue_ctx = nullptr;
};

// What a KV cache stores per element: fp32; bf16 (uint16 bits, bf16_impl.h); int8 codes with per-row fp32
// scales (the C8 cache, c8_impl.h).
enum KvKind { kKvF32 = 0, kKvBF16 = 1, kKvS8 = 2 };

struct AttnArgs {
  const float* q;        // [T, nh, hd]
  const void* k_cache;   // [nb, nkv, bs, hd] of kv_kind's element type
  const void* v_cache;
  const int64_t* query_start_loc;  // [B + 1]
  const int64_t* seq_lens;         // [B]
  const int64_t* block_tables;     // [B, max_blocks]
  int64_t num_seqs, max_blocks, num_heads, num_kv_heads, block_size, head_dim;
  float scale;
  float* out;  // [T, nh, hd]
  // C8 cache (c8_impl.h): per-row scales [nb, nkv, bs]; nullptr for the others.
  const float* k_scales = nullptr;
  const float* v_scales = nullptr;
  int kv_kind = kKvF32;
  // uint8 [T] or nullptr: 1 on prompt-token rows (AttentionMetadata.prompt_rows). A sequence's prompt
  // queries all take the lanes; its queries from its first 0 on are generated tokens and take the decode
  // step's items one query at a time. nullptr tiles every sequence's queries together by count.
  const uint8_t* prompt_rows = nullptr;
};

// The instruction-set levels, the best the CPU supports lowered by FD_KERNELS_ISA. Both bf16 levels run
// the AVX-512 code and compute the prompt rows of weight-only quantized linears in bf16 (amx.cc): on AMX
// tiles, or with AVX512-BF16 dot products (vdpbf16ps) on the same operands where there is no AMX.
enum Isa { kIsaScalar = 0, kIsaAvx2 = 1, kIsaAvx512 = 2, kIsaAvx512Bf16 = 3, kIsaAmx = 4 };
int active_isa();

namespace amx {
bool usable();                       // CPU has AMX-BF16 and the OS granted the tile state
bool has_avx512_bf16();              // CPU has AVX512-BF16 (vdpbf16ps) with AVX-512 F/BW/VL/DQ
void gemm_bf16(const GemmArgs& g);   // kS8 / kU4 / GGUF block weights, any m
// gemm_bf16 of A = silu(gate) * up, where row r of g.a (stride g.lda >= 2 g.k) is [gate | up], g.k each:
// the same numbers as silu_and_mul into a [m, k] buffer and gemm_bf16 on it, without that buffer.
void gemm_bf16_silu_mul(const GemmArgs& g);
// gemm_bf16 of gate_up (prepacked tiles, no bias, n = 2 down.k, down.k % 16 == 0), then gemm_bf16_silu_mul
// of down (prepacked tiles) on its result, with the same numbers, where gate_up's products become
// silu(gate) * up in down's bf16 A tiles directly: gate_up's C is not written; down runs its epilogue.
void gemm_gate_up_silu_down(const GemmArgs& gate_up, const GemmArgs& down);
// The bf16 tiles of a kS8 / kU4 / GGUF block weight (g's w, scales, mins, group, kind, n, k), as
// gemm_bf16 would dequantize them: tiles_elems(n, k) uint16 values into out.
int64_t tiles_elems(int64_t n, int64_t k);
void pack_tiles(const GemmArgs& g, uint16_t* out);
// a [m, lda] -> out [m, k]: each value rounded to bf16 (as amx.cc rounds), kept as fp32.
void round_rows_bf16(const float* a, int64_t m, int64_t k, int64_t lda, float* out);
}  // namespace amx

// prompt_rows (uint8 [m], may be null) marks the rows of prompt tokens. On the bf16 levels, quantized
// weights compute those rows in bf16 (amx.cc) and every other row on their kind's own path (fp32 for
// kS8 / kU4, qgemm's fixed-point activations for GGUF block kinds), so a token's numerics depend on what
// it is, never on which requests share its batch. Elsewhere it is ignored.
void gemm(const GemmArgs& g, const uint8_t* prompt_rows = nullptr);
// The prompt-row count from which a kS8 / kU4 linear computes its prompt rows on the bf16 tiles rather than
// the bf16 microkernel (different sums); 0 where no row count changes a row's numbers (not a bf16 level).
// A caller that computes a subset of a step's prompt rows keeps at least min(this, all of them) to get
// the same bits (fdcli_engine/runner/read_rows.py).
int64_t prompt_tile_min_rows();
// gemm of A = silu(gate) * up, where row r of gate_up ([g.m, g.lda], g.lda >= 2 g.k) is [gate | up], g.k
// each (g.a is ignored). When every row takes the bf16 tiles the silu happens in their input conversion;
// otherwise it is computed in place over the gate halves first. The same numbers either way.
void gemm_silu_mul(const GemmArgs& g, float* gate_up, const uint8_t* prompt_rows = nullptr);
// gemm(gate_up) into c, then gemm_silu_mul(down, c): where every row takes the bf16 tiles and both weights
// have prepacked tiles (amx::gemm_gate_up_silu_down's conditions), computed that way, with the same numbers
// for down's output, c left unwritten, and true returned; otherwise nothing is done and false returned.
bool gemm_gate_up_silu_down(const GemmArgs& gate_up, const GemmArgs& down, const uint8_t* prompt_rows);
void qgemm(const GemmArgs& g);
// Rows ids[0..t) of a GGUF block kind's [n, k] weight, dequantized to fp32 [t, k] exactly as gguf does
// (an embedding lookup in the LM head's packed table). The caller checks every id is in [0, n).
void q_rows(const void* w, int kind, int64_t k, const int64_t* ids, int64_t t, float* out);
void rms_norm(const float* x, const float* w, float eps, int64_t t, int64_t h, float* out);
void fused_add_rms_norm(const float* x, const float* res, const float* w, float eps, int64_t t, int64_t h,
                        float* out, float* res_out);
void silu_and_mul(const float* x, int64_t t, int64_t i, float* out);
// out = 2^x elementwise by vexp.h's vexp2_nonpos, the prompt softmax's exp (for its tests); x <= 0.
void exp2_nonpos(const float* x, int64_t n, float* out);
// q / k rows (one token's heads, contiguous) start q_stride / k_stride floats apart.
void rotary_embedding(const int64_t* pos, float* q, float* k, const float* cos_sin, int64_t t, int64_t nh,
                      int64_t nkv, int64_t hd, int64_t q_stride, int64_t k_stride);
void reshape_and_cache(const float* k, const float* v, float* kc, float* vc, const int64_t* slots, int64_t t,
                       int64_t nkv, int64_t bs, int64_t hd);
// C8: quantizes each (token, head) row of k / v into int8 codes kc / vc and scales ks / vs [nb, nkv, bs].
void reshape_and_cache_s8(const float* k, const float* v, int8_t* kc, int8_t* vc, float* ks, float* vs,
                          const int64_t* slots, int64_t t, int64_t nkv, int64_t bs, int64_t hd);
// bf16 cache: each value of k / v rounded to bf16 (nearest even; bf16_impl.h), stored as its 16 bits.
void reshape_and_cache_bf16(const float* k, const float* v, uint16_t* kc, uint16_t* vc, const int64_t* slots,
                            int64_t t, int64_t nkv, int64_t bs, int64_t hd);
void paged_attention(const AttnArgs& a);
// The decoder stack's attention input pass (decoder_stack.cc): for each token row of the fused QKV
// projection, q heads [, per-head RMSNorm], rotary -> q; k heads [, norm], rotary, and v heads -> the KV
// cache at the token's slot (skipped for slot < 0). The same arithmetic, per element, as split + rms_norm
// + rotary_embedding + reshape_and_cache*, with no dense K / V copies and one pass over the rows.
struct QkvToCacheArgs {
  const float* qkv;  // [t, (nh + 2 * nkv) * hd]
  int64_t t, nh, nkv, hd;
  const int64_t* pos;     // [t]
  const float* cos_sin;   // [max_pos, hd]
  const float* q_norm;    // [hd] or nullptr (then k_norm too): no per-head norm
  const float* k_norm;
  float eps;
  float* q;  // out [t, nh, hd]
  void* k_cache;  // [nb, nkv, bs, hd] of kv_kind's element type
  void* v_cache;
  float* k_scales;  // C8 only
  float* v_scales;
  int kv_kind;
  const int64_t* slots;  // [t]
  int64_t bs;
};
void qkv_rope_to_cache(const QkvToCacheArgs& a);
// silu_and_mul in place: row r's gate half [r * 2n, r * 2n + n) becomes silu(gate) * up, the up half is
// left as it was; the result is read as [t, n] rows 2n apart. Same arithmetic as silu_and_mul.
void silu_and_mul_inplace(float* x, int64_t t, int64_t n);
// The C8 rule over `rows` contiguous rows of hd values and its inverse (KV offload's int8 tier).
void kv_s8_quantize(const float* x, int64_t rows, int64_t hd, int8_t* q, float* s);
void kv_s8_dequantize(const int8_t* q, const float* s, int64_t rows, int64_t hd, float* out);
// The same over bf16 rows (their bits): widened before the rule, restored values rounded to bf16.
void kv_s8_quantize_bf16(const uint16_t* x, int64_t rows, int64_t hd, int8_t* q, float* s);
void kv_s8_dequantize_bf16(const int8_t* q, const float* s, int64_t rows, int64_t hd, uint16_t* out);

}  // namespace fdk
