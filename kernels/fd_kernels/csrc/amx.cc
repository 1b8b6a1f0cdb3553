// bf16 GEMM for the prompt rows of weight-only quantized linears (kS8, kU4, GGUF blocks): on Intel AMX
// tiles (the kIsaAmx level), or, on CPUs with AVX512-BF16 but no AMX (kIsaAvx512Bf16: AMD Zen 4 and
// later, Cooper Lake), with vdpbf16ps on the very same operand layouts (block_dp).
//
// Numerics (shared with the AVX-512 path's bf16 mode in kern_impl.h, so a row's result does not depend on
// which path the batch took beyond fp32 summation order): activations and dequantized weights are rounded
// to bf16 (round-to-nearest-even, the same integer formula in both paths), products are exact in fp32 and
// accumulated in fp32. The weights are dequantized exactly as the AVX-512 path does (q * s, or
// fma(q, s, min)) before rounding. Rounding a 4- or 8-bit weight's dequantized value to bf16 adds an error
// far below its quantization step; the activation rounding (relative 2^-9) is what this mode costs. Each
// element sums its k-pairs in k order on either level, so on a given CPU a row's bits do not depend on
// its batch; the two levels may differ in the last bits (how a pair's two products are added).
//
// Layout: every operand tile is 1 KB of contiguous memory (16 rows of 64 bytes), so a tile load touches
// 16 consecutive cache lines. A is converted once per call to bf16 tiles [Mp/32][Kp/32][2][16][32] (rows
// padded to 32, K to 32, zeros). A weight panel (kNR = 32 columns) is bf16 in AMX's pair-interleaved
// ("VNNI") order, tiles [Kp/32][2][16][32]: tile (s, h) holds k-step s's 16 k-pairs for columns
// 16h..16h+15, each 32-bit lane one column's (k = 2r, k = 2r + 1), which is also vdpbf16ps's operand
// order. Panels come either prepacked once at load (amx::pack_tiles, the LinearWeight's `tiles`) or
// dequantized per call a group at a time (gemm_kind). Each 32-row block of A runs against a panel with
// four 16x16 fp32 accumulator tiles (AMX) or, 8 rows at a time, 16 zmm accumulators (block_dp).

#include <immintrin.h>
#include <omp.h>

#include <memory>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "amx_tiles.h"
#include "kernels.h"

namespace fdk {

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c,avx512bf16,amx-tile,amx-bf16")

namespace {

constexpr int64_t kRows = 32;  // rows per block: two A tiles of 16
constexpr int64_t kKStep = 32;  // bf16 k's per tile (64 bytes per tile row)

// Whether this process multiplies on AMX tiles (else with block_dp's vdpbf16ps).
inline bool uses_tiles() { return active_isa() == kIsaAmx; }

// vexp.h's silu(gate) * up at the AVX-512 width (the AMX level's), the function kern_impl.h's
// silu_and_mul calls, so a fused conversion rounds the very value that op would have stored.
namespace silu16 {
#define FD_W 16
#include "simd.h"
#include "vexp.h"
#undef FD_W
}  // namespace silu16

// fp32 -> bf16 bits (round to nearest even) in the high half of each lane, low half zero: simd.h's
// vround_bf16, the value the AVX-512 bf16 mode multiplies by. NaN/Inf are not special-cased (activations
// and weights are finite).
inline __m512i round_hi(__m512 x) { return _mm512_castps_si512(silu16::vround_bf16(x)); }

// 16 fp32 -> their bf16 bits by round_hi, packed.
inline __m256i round_bf16(__m512 x) { return _mm512_cvtepi32_epi16(_mm512_srli_epi32(round_hi(x), 16)); }

inline uint16_t round_scalar(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  u += 0x7FFF + ((u >> 16) & 1);
  return (uint16_t)(u >> 16);
}

// Offset of (row r, k) in A's tile layout: 32-row block, k-step, 16-row half, row, k within the step.
inline int64_t a_offset(int64_t r, int64_t k, int64_t kp) {
  return ((r / kRows * (kp / kKStep) + k / kKStep) * 2 + r % kRows / 16) * 512 + r % 16 * kKStep + k % kKStep;
}

// fpclass categories vcvtneps2bf16 does not round as round_hi does: quiet NaN, denormal, signalling NaN.
constexpr int kOddClass = 0x01 | 0x20 | 0x80;

// Row r of the activations (zeros past m and k) -> its place in A's bf16 tiles, out holding A's tiles from
// row `first` (a multiple of kRows). With `silu`, row r of g.a holds [gate | up] (2k values) and A's row
// is silu(gate) * up.
void convert_row(const GemmArgs& g, int64_t r, int64_t kp, uint16_t* out, bool silu, int64_t first = 0) {
  const float* a = g.a + r * g.lda;
  const float* up = a + g.k;
  for (int64_t k = 0; k < kp; k += kKStep) {
    uint16_t* o = out + a_offset(r - first, k, kp);
    int64_t j = 0;
    if (r < g.m && k + kKStep <= g.k) {
      // A whole k-step in one vcvtne2ps2bf16, which rounds to nearest even as round_hi does for every
      // value but denormals (it flushes them) and NaNs (its quiet NaN): those k-steps take round_hi.
      __m512 v0 = _mm512_loadu_ps(a + k), v1 = _mm512_loadu_ps(a + k + 16);
      if (silu) {
        v0 = silu16::vsilu_mul(v0, _mm512_loadu_ps(up + k));
        v1 = silu16::vsilu_mul(v1, _mm512_loadu_ps(up + k + 16));
      }
      if (!(_mm512_fpclass_ps_mask(v0, kOddClass) | _mm512_fpclass_ps_mask(v1, kOddClass))) {
        _mm512_store_si512(o, (__m512i)_mm512_cvtne2ps_pbh(v1, v0));
        continue;
      }
      for (const __m512 v : {v0, v1}) {
        _mm256_store_si256((__m256i*)(o + j), round_bf16(v));
        j += 16;
      }
      continue;
    }
    if (r < g.m) {
      for (; j + 16 <= kKStep && k + j + 16 <= g.k; j += 16) {
        __m512 v = _mm512_loadu_ps(a + k + j);
        if (silu) v = silu16::vsilu_mul(v, _mm512_loadu_ps(up + k + j));
        _mm256_storeu_si256((__m256i*)(o + j), round_bf16(v));
      }
      for (; j < kKStep && k + j < g.k; ++j)
        o[j] = round_scalar(silu ? silu16::silu_mul_tail(a[k + j], up[k + j]) : a[k + j]);
    }
    for (; j < kKStep; ++j) o[j] = 0;
  }
}

// A fused gate_up block (acc: 32 rows of 16 gate columns then the 16 matching up columns, the fp32 values
// gate_up's C would hold) -> silu(gate) * up in columns [16 p, 16 p + 16) of rows [m0, m0 + 32) of the next
// GEMM's A tiles (K = k, padded to kp), each value rounded as convert_row rounds it; zeros in the rows past m
// and, from the last column block, in the K padding.
void silu_to_a(const float* acc, int64_t m, int64_t m0, int64_t p, int64_t k, int64_t kp, uint16_t* out) {
  for (int64_t r = 0; r < kRows; ++r) {
    uint16_t* o = out + a_offset(m0 + r, p * 16, kp);
    __m256i bits = _mm256_setzero_si256();
    if (m0 + r < m) {
      const __m512 v = silu16::vsilu_mul(_mm512_load_ps(acc + r * kNR), _mm512_load_ps(acc + r * kNR + 16));
      bits = _mm512_fpclass_ps_mask(v, kOddClass) ? round_bf16(v) : (__m256i)_mm512_cvtneps_pbh(v);
    }
    _mm256_store_si256((__m256i*)o, bits);
    if ((p + 1) * 16 == k && k % kKStep) _mm256_store_si256((__m256i*)(o + 16), _mm256_setzero_si256());
  }
}

// Activations [m, lda] fp32 -> A's bf16 tiles, zero padded.
void convert_a(const GemmArgs& g, int64_t mp, int64_t kp, uint16_t* out, bool silu) {
#pragma omp parallel for schedule(static) if (g.m * g.k >= (1 << 15))
  for (int64_t r = 0; r < mp; ++r) convert_row(g, r, kp, out, silu);
}

// Where pair row pr (k = 2 pr, 2 pr + 1) of a panel's column half h starts in its tile layout.
inline int64_t b_offset(int64_t pr, int h) { return (pr / 16 * 2 + h) * 512 + pr % 16 * kKStep; }

// Row k of panel p, dequantized as the AVX-512 path does: columns 0-15 in lo, 16-31 in hi.
template <int KIND>
inline void dequant_row(const GemmArgs& g, int64_t p, int64_t k, int64_t ngroups, __m512& lo, __m512& hi) {
  const int64_t off = (p * ngroups + k / g.group) * kNR;
  const __m512 s0 = _mm512_loadu_ps(g.scales + off), s1 = _mm512_loadu_ps(g.scales + off + 16);
  if (KIND == kS8) {
    const int8_t* bp = (const int8_t*)g.w + (p * g.k + k) * kNR;
    lo = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)bp))), s0);
    hi = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)(bp + 16)))), s1);
  } else {
    const uint8_t* bp = (const uint8_t*)g.w + (p * g.k + k) * (kNR / 2);
    const __m512i b = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)bp));
    const __m512i m15 = _mm512_set1_epi32(15);
    const __m512 q0 = _mm512_cvtepi32_ps(_mm512_and_si512(b, m15));
    const __m512 q1 = _mm512_cvtepi32_ps(_mm512_and_si512(_mm512_srli_epi32(b, 4), m15));
    lo = _mm512_fmadd_ps(q0, s0, _mm512_loadu_ps(g.mins + off));
    hi = _mm512_fmadd_ps(q1, s1, _mm512_loadu_ps(g.mins + off + 16));
  }
}

// Panel p -> its bf16 tiles (see Layout): lane c of pair row r holds (k = 2r, k = 2r + 1) of column c.
template <int KIND>
void pack_panel(const GemmArgs& g, int64_t p, int64_t kp, uint16_t* out) {
  const int64_t ngroups = (g.k + g.group - 1) / g.group;
  const __m512 zero = _mm512_setzero_ps();
  for (int64_t k = 0; k < kp; k += 2) {
    __m512 a0 = zero, a1 = zero, b0 = zero, b1 = zero;
    if (k < g.k) dequant_row<KIND>(g, p, k, ngroups, a0, a1);
    if (k + 1 < g.k) dequant_row<KIND>(g, p, k + 1, ngroups, b0, b1);
    _mm512_storeu_si512(out + b_offset(k / 2, 0), _mm512_or_si512(round_hi(b0), _mm512_srli_epi32(round_hi(a0), 16)));
    _mm512_storeu_si512(out + b_offset(k / 2, 1), _mm512_or_si512(round_hi(b1), _mm512_srli_epi32(round_hi(a1), 16)));
  }
}

// GGUF block kinds: 32 columns from the 16-column panels 2p and 2p + 1, each value d * (u - z) or
// d * u + m in fp32 (as packing.Packed.dequantize), then rounded like the other kinds. Lane c of a record's
// 64-byte chunk holds column c's 4 code bytes (kernels.h), so shifting lanes by 8j picks byte j of
// every column at once.
template <int KIND>
void pack_panel_q(const GemmArgs& g, int64_t p, uint16_t* out) {
  const int64_t qpanels = (g.n + kQNR - 1) / kQNR, nb = g.k / kQBlock, rec = q_record_bytes(KIND);
  const __m512i byte = _mm512_set1_epi32(255), low4 = _mm512_set1_epi32(15);
  const __m512 z = _mm512_set1_ps((float)q_zero(KIND));
  for (int64_t b = 0; b < nb; ++b) {
    for (int h = 0; h < 2; ++h) {
      const int64_t qp = 2 * p + h;
      __m512 v[kQBlock];
      if (qp >= qpanels) {
        for (int j = 0; j < kQBlock; ++j) v[j] = _mm512_setzero_ps();
      } else {
        const uint8_t* r = (const uint8_t*)g.w + (qp * nb + b) * rec;
        const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)r));
        const __m512 m = KIND == kQ4_1 ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(r + 32)))
                                       : _mm512_setzero_ps();
        const uint8_t* codes = r + q_codes_offset(KIND);
        for (int c = 0; c < (KIND == kQ8_0 ? 8 : 4); ++c) {
          const __m512i raw = _mm512_loadu_si512(codes + 64 * c);
          for (int j = 0; j < 4; ++j) {
            const __m512i bj = _mm512_and_si512(_mm512_srli_epi32(raw, 8 * j), byte);
            if (KIND == kQ8_0) {
              v[4 * c + j] = _mm512_mul_ps(d, _mm512_sub_ps(_mm512_cvtepi32_ps(bj), z));
            } else {
              const __m512 lo = _mm512_cvtepi32_ps(_mm512_and_si512(bj, low4));
              const __m512 hi = _mm512_cvtepi32_ps(_mm512_srli_epi32(bj, 4));
              // d * u is exact, so fma(d, u, m) rounds once, as dequantize() does.
              v[8 * c + j] = KIND == kQ4_1 ? _mm512_fmadd_ps(d, lo, m) : _mm512_mul_ps(d, _mm512_sub_ps(lo, z));
              v[8 * c + 4 + j] = KIND == kQ4_1 ? _mm512_fmadd_ps(d, hi, m) : _mm512_mul_ps(d, _mm512_sub_ps(hi, z));
            }
          }
        }
      }
      for (int j = 0; j < kQBlock; j += 2) {
        _mm512_storeu_si512(out + b_offset((b * kQBlock + j) / 2, h),
                            _mm512_or_si512(round_hi(v[j + 1]), _mm512_srli_epi32(round_hi(v[j]), 16)));
      }
    }
  }
}

// The block's 32 x 32 fp32 result (tiles 0-3, 2 x 2 of 16 x 16) to c, rows ld floats apart.
inline __attribute__((always_inline)) void store_c_tiles(float* c, int64_t ld) {
  _tile_stored(0, c, ld * 4);
  _tile_stored(1, c + 16, ld * 4);
  _tile_stored(2, c + 16 * ld, ld * 4);
  _tile_stored(3, c + 16 * ld + 16, ld * 4);
}

// A finished 32 x 32 fp32 block (tmp, rows kNR apart) into rows [0, rows) and columns [0, ncols) of c (at
// column n0 of C, rows g.n apart), bias added; with nt, a full block without bias is written with
// non-temporal stores.
void tmp_to_c(const GemmArgs& g, const float* tmp, float* c, int64_t n0, int64_t rows, int64_t ncols, bool nt) {
  if (nt && rows == kRows && ncols == kNR && !g.bias) {
    for (int64_t r = 0; r < kRows; ++r) {
      _mm512_stream_ps(c + r * g.n, _mm512_load_ps(tmp + r * kNR));
      _mm512_stream_ps(c + r * g.n + 16, _mm512_load_ps(tmp + r * kNR + 16));
    }
    return;
  }
  for (int64_t r = 0; r < rows; ++r) {
    float* cr = c + r * g.n;
    const float* t = tmp + r * kNR;
    if (ncols == kNR) {
      __m512 c0 = _mm512_load_ps(t), c1 = _mm512_load_ps(t + 16);
      if (g.bias) {
        c0 = _mm512_add_ps(c0, _mm512_loadu_ps(g.bias + n0));
        c1 = _mm512_add_ps(c1, _mm512_loadu_ps(g.bias + n0 + 16));
      }
      _mm512_storeu_ps(cr, c0);
      _mm512_storeu_ps(cr + 16, c1);
    } else {
      for (int64_t j = 0; j < ncols; ++j) cr[j] = t[j] + (g.bias ? g.bias[n0 + j] : 0.0f);
    }
  }
}

// Bytes of an A block (32 rows of A's bf16 tiles) up to which its tiles stay in L1 (48 KB) across the
// panels of an item, provided the panels' tiles do not pass through L1.
constexpr int64_t kL1ABlockBytes = 40 << 10;

// Whether block() loads the weight's tiles with tileloaddt1, which does not keep them in L1: where an A
// block fits there, so it is read from L1 for every panel after the first, with only B read from L2. A
// block and a panel of 36 KB each (K = 576) would otherwise evict each other and both come from L2 for
// every product. Where the A block is larger than L1 anyway, B's tiles are loaded as usual.
inline bool streams_b(int64_t kp) { return kp * kRows * 2 <= kL1ABlockBytes; }

// The k's of an item's pass over its panels: all of kp where an A block fits L1, else kp cut into the
// fewest equal slabs (whole k-steps) whose A tiles do, each slab's partial sums kept between passes in a
// scratch of the item's C blocks. Storing and reloading the fp32 accumulators is exact and every element
// still sums its k-steps in order, so the result is the same bit for bit.
inline int64_t k_slab(int64_t kp) {
  const int64_t slabs = (kp * kRows * 2 + kL1ABlockBytes - 1) / kL1ABlockBytes;
  return ((kp + slabs - 1) / slabs + kKStep - 1) / kKStep * kKStep;
}

// A weight tile into tile register t (a literal: GCC's tile intrinsics spell it into the instruction),
// with tileloaddt1 where kStream.
#define FD_LOAD_B(kStream, t, src)    \
  do {                                \
    if constexpr (kStream)            \
      _tile_stream_loadd(t, src, 64); \
    else                              \
      _tile_loadd(t, src, 64);        \
  } while (0)

// One 32-row block of A (its tiles at ablk) against one panel's tiles; writes rows [m0, min(m0 + 32, m)) of
// C. Each tile load is issued one product ahead of the product that first reads it, so a product waits for
// at most one load.
// With `loaded`, the caller's previous block already loaded this block's first A and B tiles (tiles 4 and
// 6); with `next_b`, this block loads its own first A tile and next_b's first B tile for the next block of
// the same rows before storing C, since a tile load issued after the C stores waits for them. kStreamB:
// see streams_b. [k0, k1) (default all of kp) are the k's of this pass (k_slab): a pass after the first
// starts from the partial sums in acc (a 32 x 32 fp32 block; read with tileloaddt1, as the A slab is what
// L1 should keep), a pass before the last leaves them there instead of writing C. With `to_acc` every pass
// leaves them in acc (the caller reads the block from there). bp_hi (default bp + 512, the panel's second
// column half) is where the tiles of the accumulators' columns 16-31 start, kNR * kKStep apart per k-step.
template <bool kStreamB>
void block(const GemmArgs& g, const uint16_t* ablk, int64_t kp, const uint16_t* bp, int64_t m0, int64_t p,
           bool loaded = false, const uint16_t* next_b = nullptr, bool own_pf = false, bool nt = false,
           int64_t k0 = 0, int64_t k1 = -1, float* acc = nullptr, bool to_acc = false,
           const uint16_t* bp_hi = nullptr) {
  if (k1 < 0) k1 = kp;
  const bool last = k1 == kp && !to_acc;
  if (!bp_hi) bp_hi = bp + 512;
  if (k0 == 0) {
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
  } else {
    _tile_stream_loadd(0, acc, kNR * 4);
    _tile_stream_loadd(1, acc + 16, kNR * 4);
    _tile_stream_loadd(2, acc + 16 * kNR, kNR * 4);
    _tile_stream_loadd(3, acc + 16 * kNR + 16, kNR * 4);
  }
  const uint16_t* a = ablk + k0 * kRows;  // this block's tiles from k0
  bp += k0 * kNR;
  bp_hi += k0 * kNR;
  const int64_t n0 = p * kNR, ncols = std::min<int64_t>(kNR, g.n - n0);
  const int64_t rows = std::min<int64_t>(kRows, g.m - m0);
  float* c = g.c + m0 * g.n + n0;
  // The next panel's 32 x 32 block of C, two lines a row, made writable in this block's products; with
  // own_pf (a block no previous block prefetched for) this block's own C too.
  const bool pf = last && !nt && n0 + 2 * kNR <= g.n;
  own_pf = last && own_pf && !nt;
  float* const pf_c = own_pf ? c : c + kNR;
  // All 32 rows within this pass's k-steps.
  const int64_t pf_rows = std::max<int64_t>(4, (kRows * kKStep + (k1 - k0) - 1) / (k1 - k0));
  int64_t pr = 0;
  if (!loaded) {
    _tile_loadd(4, a, 64);
    FD_LOAD_B(kStreamB, 6, bp);
  }
  for (int64_t k = 0; k < k1 - k0; k += kKStep) {
    const uint16_t *at = a + k * kRows, *bt = bp + k * kNR, *bt_hi = bp_hi + k * kNR;
    const bool more = k + kKStep < k1 - k0;
    if (pf || own_pf) {
      for (int64_t j = 0; j < pf_rows && pr < rows; ++j, ++pr) {
        _mm_prefetch((const char*)(pf_c + pr * g.n), _MM_HINT_ET0);
        _mm_prefetch((const char*)(pf_c + 16 + pr * g.n), _MM_HINT_ET0);
        if (own_pf && pf) {
          _mm_prefetch((const char*)(c + kNR + pr * g.n), _MM_HINT_ET0);
          _mm_prefetch((const char*)(c + kNR + 16 + pr * g.n), _MM_HINT_ET0);
        }
      }
    }
    FD_LOAD_B(kStreamB, 7, bt_hi);
    _tile_dpbf16ps(0, 4, 6);
    _tile_loadd(5, at + 512, 64);
    _tile_dpbf16ps(1, 4, 7);
    if (more) _tile_loadd(4, at + kKStep * kRows, 64);
    _tile_dpbf16ps(2, 5, 6);
    if (more) FD_LOAD_B(kStreamB, 6, bt + kKStep * kNR);
    _tile_dpbf16ps(3, 5, 7);
  }
  if (next_b) {
    _tile_loadd(4, a, 64);
    FD_LOAD_B(kStreamB, 6, next_b + k0 * kNR);
  }
  if (!last) {
    store_c_tiles(acc, kNR);
    return;
  }
  if (!nt && rows == kRows && ncols == kNR && !g.bias) {
    store_c_tiles(c, g.n);
    return;
  }
  alignas(64) float tmp[kRows * kNR];
  store_c_tiles(tmp, kNR);
  tmp_to_c(g, tmp, c, n0, rows, ncols, nt);
}

// One 32-row block of A against one panel, as block() computes it, with vdpbf16ps instead of tiles (the
// kIsaAvx512Bf16 level): 8 rows x 32 columns of fp32 accumulators (16 zmm) at a time, each k-pair of B
// (one 64-byte tile row per column half) loaded once for the 8 rows, each row's pair broadcast. [k0, k1),
// acc, to_acc and bp_hi as block()'s; its tile-load and prefetch options have no counterpart here. A
// sub-block of rows entirely past m is skipped (A's padding rows are zeros, so a partial one is computed
// whole and its extra rows dropped).
void block_dp(const GemmArgs& g, const uint16_t* ablk, int64_t kp, const uint16_t* bp, int64_t m0, int64_t p,
              bool nt, int64_t k0, int64_t k1, float* acc, bool to_acc, const uint16_t* bp_hi) {
  constexpr int kSub = 8;
  if (k1 < 0) k1 = kp;
  const bool last = k1 == kp && !to_acc;
  if (!bp_hi) bp_hi = bp + 512;
  const int64_t n0 = p * kNR, ncols = std::min<int64_t>(kNR, g.n - n0);
  const int64_t rows = std::min<int64_t>(kRows, g.m - m0);
  float* c = g.c + m0 * g.n + n0;
  const bool direct = last && !nt && rows == kRows && ncols == kNR && !g.bias;
  alignas(64) float tmp[kRows * kNR];
  for (int64_t r0 = 0; r0 < rows; r0 += kSub) {
    __m512 c0[kSub], c1[kSub];
    for (int r = 0; r < kSub; ++r) {
      c0[r] = k0 == 0 ? _mm512_setzero_ps() : _mm512_load_ps(acc + (r0 + r) * kNR);
      c1[r] = k0 == 0 ? _mm512_setzero_ps() : _mm512_load_ps(acc + (r0 + r) * kNR + 16);
    }
    for (int64_t k = k0; k < k1; k += kKStep) {
      // Row r0's k-step in A's tiles; the sub-block's rows follow at kKStep apart (r0 % 16 + 8 <= 16).
      const uint16_t* at = ablk + k * kRows + r0 / 16 * 512 + r0 % 16 * kKStep;
      const uint16_t *b0 = bp + k * kNR, *b1 = bp_hi + k * kNR;
      for (int j = 0; j < kKStep / 2; ++j) {
        const __m512bh w0 = (__m512bh)_mm512_loadu_si512(b0 + j * kKStep);
        const __m512bh w1 = (__m512bh)_mm512_loadu_si512(b1 + j * kKStep);
        for (int r = 0; r < kSub; ++r) {
          int32_t pair;
          std::memcpy(&pair, at + r * kKStep + 2 * j, 4);
          const __m512bh x = (__m512bh)_mm512_set1_epi32(pair);
          c0[r] = _mm512_dpbf16_ps(c0[r], x, w0);
          c1[r] = _mm512_dpbf16_ps(c1[r], x, w1);
        }
      }
    }
    float* out = !last ? acc : direct ? c : tmp;
    const int64_t ld = direct ? g.n : kNR;
    for (int r = 0; r < kSub; ++r) {
      _mm512_storeu_ps(out + (r0 + r) * ld, c0[r]);
      _mm512_storeu_ps(out + (r0 + r) * ld + 16, c1[r]);
    }
  }
  if (last && !direct) tmp_to_c(g, tmp, c, n0, rows, ncols, nt);
}

// Bytes of bf16 panels worked on at a time: kept in L2 (2 MB a core) while every row block of A passes
// over them.
constexpr int64_t kGroupBytes = 3 << 19;

// Bytes of a chunk where the weight is larger than kGroupBytes (several chunks) and C is not streamed: there
// each item's 32 rows of C across the chunk's columns pass through L2 beside the chunk, so the chunk is kept
// smaller to stay there.
constexpr int64_t kSplitGroupBytes = 1 << 20;

// Bytes of A's bf16 tiles up to which each thread keeps all of A in its L2 (see gemm_prepacked).
constexpr int64_t kSharedABytes = 1 << 20;

// How gemm_prepacked shares out its work: the panels are cut into `regions` (one per thread where A is
// small, or where K is cut into slabs over several chunks of the weight; else one), each region into
// L2-sized chunks of `chunk` panels; a region's items are (chunk, row block) pairs, chunk by chunk, its row
// blocks starting at `rb_offset(region)`.
struct Plan {
  int64_t panels, nrb, regions, region_panels, chunk;
  int64_t first(int64_t r) const { return std::min(panels, r * region_panels); }
  int64_t chunks(int64_t r) const { return (first(r + 1) - first(r) + chunk - 1) / chunk; }
  int64_t rb_offset(int64_t r) const { return r * nrb / regions; }
};

Plan plan(int64_t kp, int64_t nrb, int64_t panels, int64_t nth, bool streamed_c) {
  const int64_t panel_bytes = kp * kNR * 2;
  const int64_t group_bytes = !streamed_c && panels * panel_bytes > kGroupBytes ? kSplitGroupBytes : kGroupBytes;
  Plan pl{panels, nrb, 1, panels, std::clamp<int64_t>(group_bytes / panel_bytes, 1, panels)};
  // Per thread, regions read A + W / nth bytes and shared rows W + A / nth. Regions read the rows of A
  // another thread converted from that thread's cache, which costs more a byte than the weight's own
  // stream, so they pay only where A is well under the weight: at most 2/3 of it.
  const int64_t a_bytes = nrb * kRows * kp * 2;
  // Where K is cut into slabs and shared rows would cut the weight into several chunks, each chunk after
  // the first reads every row block's A tiles again, from L3 or from the converting thread's cache, as a
  // region reads another thread's rows. Per thread, regions then read A + W / nth bytes and shared rows
  // W + chunks * A / nth: regions pay where A * (nth - chunks) < W * (nth - 1), however large A is.
  const int64_t chunks = (panels + pl.chunk - 1) / pl.chunk, w_bytes = panels * panel_bytes;
  const bool slab_chunks = k_slab(kp) < kp && chunks > 1 && a_bytes * (nth - chunks) < w_bytes * (nth - 1);
  if (nth > 1 && panels >= nth &&
      (slab_chunks || (a_bytes <= kSharedABytes && 3 * a_bytes <= 2 * w_bytes))) {
    pl.regions = nth;
    pl.region_panels = (panels + nth - 1) / nth;
    pl.chunk = std::min(pl.chunk, pl.region_panels);
  }
  // With few row blocks the chunks are cut smaller, so that every thread has items.
  while (pl.chunk > 1 && pl.regions * ((pl.region_panels + pl.chunk - 1) / pl.chunk) * nrb < 4 * nth)
    pl.chunk = (pl.chunk + 1) / 2;
  // As many chunks, of even sizes: a last chunk of a few panels would reload every A block for little work.
  const int64_t n = (pl.region_panels + pl.chunk - 1) / pl.chunk;
  pl.chunk = (pl.region_panels + n - 1) / n;
  return pl;
}

// Bytes of C from which full blocks are written with non-temporal stores: C this large (an LM head over
// hundreds of rows) goes to memory anyway, and ordinary stores would first read every line of it.
constexpr int64_t kStreamBytes = int64_t{32} << 20;

// Whether full blocks of C are streamed: only where every full block's rows are whole 64-byte lines.
bool streams_c(const GemmArgs& g) {
  return g.m * g.n * (int64_t)sizeof(float) >= kStreamBytes && g.n % 16 == 0 && (uintptr_t)g.c % 64 == 0;
}

// A buffer of `elems` bf16 values of A's tiles, to be freed with std::free. It starts on a page, so that no
// 1 KB tile straddles two pages (and every 64-byte tile row is one cache line).
uint16_t* alloc_a_tiles(int64_t elems) {
  return (uint16_t*)std::aligned_alloc(4096, (elems * 2 + 4095) / 4096 * 4096);
}

// What gemm_prepacked reads or writes instead of converting A or writing C (see there).
struct TileIo {
  uint16_t* pre_a = nullptr;        // A's tiles, converted already (only read)
  uint16_t* silu_out = nullptr;     // the next GEMM's A tiles, K padded to out_kp
  int64_t out_kp = 0;
};

// Prepacked panels, cut into L2-sized chunks; the work items are (chunk, 32-row block) pairs, chunk by
// chunk, claimed in turn from a queue by whichever thread is free (each thread its own queue first, where it
// has one), so the threads stay even when one of them loses its core for a while. An A block (or, at large
// K, a k-slab of it: k_slab) stays in L1 across a chunk's panels, its rows of C written left to right.
// Where A's tiles are small (a prompt of a few hundred rows) and at most 2/3 of the weight's, each thread
// has a region of the panels and keeps all of A in its L2: the threads read disjoint weights, each from
// memory once per call, and a thread that runs out of items takes the next ones of another region. Where
// K is cut into slabs and the weight into several chunks, regions keep each thread's part of the weight in
// its L2 however large A is (see plan). Otherwise, where A is larger, there is one region: the threads
// share out each chunk's rows, each reading only its own rows of A. Whichever item first needs a row block
// converts its rows of A (no separate conversion pass, parallel region or barrier); another item needing it
// meanwhile waits, which never deadlocks, since a conversion waits for nothing. The item that completes a
// row block's last chunk runs g.epilogue on its rows (acquiring the other items' stores of C). A block's
// result does not depend on which thread or item computes it.
//
// With io.silu_out (g a gate_up weight, [gate | up] columns, n = 2 k' with k' % 16 == 0), the "panels" are
// k' / 16: panel p pairs gate's column half p with up's half p + k' / 16 (the micro-kernel's two B tiles
// taken from those halves), so a block's accumulators hold 16 gate columns and the matching 16 up columns,
// each summed in the same order as the plain call sums it; silu_to_a writes them into the next GEMM's A
// tiles instead of C. With io.pre_a, A's tiles are read from there (made by such a call), not converted.
void gemm_prepacked(const GemmArgs& g, int64_t kp, int64_t nrb, int64_t panels, bool silu, const TileIo& io = {}) {
  const int64_t panel_elems = kp * kNR, nth = omp_get_max_threads();
  const bool fused = io.silu_out != nullptr;
  const bool nt = streams_c(g) && !fused;
  const Plan pl = plan(kp, nrb, panels, nth, nt);
  const int64_t slab = k_slab(kp);  // A's tiles of a slab fit L1, so B is streamed (streams_b)
  int64_t row_items = 0;  // items per row block
  for (int64_t r = 0; r < pl.regions; ++r) row_items += pl.chunks(r);
  // With one item per row block no other item reads its A tiles, so each thread converts its items' rows
  // into one private A block, which stays in L1/L2 from item to item: the conversion's stores then need
  // no lines from L3, and its A tiles pollute no shared buffer, which is then not allocated at all.
  const bool own_a = row_items == 1 && !io.pre_a;
  // Not value-initialized: each row block's item converts all of its rows, padding included, before any
  // item reads them.
  std::unique_ptr<uint16_t[], decltype(&std::free)> shared_a(
      own_a || io.pre_a ? nullptr : alloc_a_tiles(nrb * kRows * kp), &std::free);
  // With io.pre_a, that is the shared buffer, each row block marked converted.
  uint16_t* const abf = io.pre_a ? io.pre_a : shared_a.get();
  // Column half hp's tiles (a panel's columns 16 (hp % 2) .. + 15).
  auto half_tiles = [&](int64_t hp) { return g.tiles + hp / 2 * panel_elems + hp % 2 * 512; };
  // Claim queues: one per region in panel regions; with one region, one per thread, each a contiguous share
  // of the row blocks, chunk by chunk, so that from call to call (and from chunk to chunk) the same thread
  // converts and reads the same rows of A and writes the same rows of C, as the ops before and after it
  // (static shares of the rows) do, and those lines are already in its core's caches.
  const int64_t lanes = pl.regions > 1 ? pl.regions : nth;
  struct alignas(64) Lane {
    std::atomic<int64_t> next;
  };
  std::unique_ptr<Lane[]> lane(new Lane[lanes]);
  for (int64_t l = 0; l < lanes; ++l) lane[l].next.store(0, std::memory_order_relaxed);
  // Per row block: A's state (0 not converted, 1 converting, 2 converted) and its items done.
  std::unique_ptr<std::atomic<uint8_t>[]> state(new std::atomic<uint8_t>[nrb]);
  std::unique_ptr<std::atomic<int32_t>[]> done(new std::atomic<int32_t>[nrb]);
  for (int64_t rb = 0; rb < nrb; ++rb) {
    state[rb].store(io.pre_a ? 2 : 0, std::memory_order_relaxed);
    done[rb].store(0, std::memory_order_relaxed);
  }
  const bool tiles = uses_tiles();
#pragma omp parallel if (row_items * nrb > 1)
  {
    if (tiles) load_amx_tile_config();
    const int64_t t = omp_get_thread_num();
    // Where K is cut into slabs: the partial sums of an item's C blocks between passes (see k_slab); with
    // silu_out, the blocks' sums for silu_to_a.
    std::unique_ptr<float[], decltype(&std::free)> acc(
        slab < kp || fused ? (float*)std::aligned_alloc(64, pl.chunk * kRows * kNR * 4) : nullptr, &std::free);
    // Where each row block has one item: this thread's A block, converted into the same lines every item.
    std::unique_ptr<uint16_t[], decltype(&std::free)> own(
        own_a ? alloc_a_tiles(kRows * kp) : nullptr, &std::free);
    // This thread's own lane first, then the others' in turn: a thread whose core was taken for a while
    // leaves its items to the other threads.
    for (int64_t k = 0; k < lanes; ++k) {
      const int64_t l = (t + k) % lanes, r = pl.regions > 1 ? l : 0;
      const int64_t lo = pl.regions > 1 ? pl.rb_offset(r) : l * nrb / lanes;
      const int64_t len = pl.regions > 1 ? nrb : (l + 1) * nrb / lanes - lo, items = pl.chunks(r) * len;
      for (int64_t it = lane[l].next.fetch_add(1, std::memory_order_relaxed); it < items;
           it = lane[l].next.fetch_add(1, std::memory_order_relaxed)) {
        const int64_t p0 = pl.first(r) + it / len * pl.chunk, p1 = std::min(pl.first(r + 1), p0 + pl.chunk);
        const int64_t rb = (lo + it % len) % nrb;
        const uint16_t* ablk = own ? own.get() : abf + rb * kRows * kp;
        if (own) {
          for (int64_t row = rb * kRows; row < (rb + 1) * kRows; ++row)
            convert_row(g, row, kp, own.get(), silu, rb * kRows);
        } else if (uint8_t st = state[rb].load(std::memory_order_acquire);
                   st == 0 && state[rb].compare_exchange_strong(st, 1, std::memory_order_acquire)) {
          for (int64_t row = rb * kRows; row < (rb + 1) * kRows; ++row) convert_row(g, row, kp, abf, silu);
          state[rb].store(2, std::memory_order_release);
        } else {
          while (state[rb].load(std::memory_order_acquire) != 2) std::this_thread::yield();
        }
        for (int64_t k0 = 0; k0 < kp; k0 += slab) {
          const int64_t k1 = std::min(kp, k0 + slab);
          for (int64_t p = p0; p < p1; ++p) {
            const uint16_t* bp = fused ? half_tiles(p) : g.tiles + p * panel_elems;
            const uint16_t* next_b = p + 1 >= p1 ? nullptr : fused ? half_tiles(p + 1) : bp + panel_elems;
            // One block's slot where every block sums all of K in one pass (it stays in L1).
            float* const pacc = !acc ? nullptr : acc.get() + (slab < kp ? (p - p0) * kRows * kNR : 0);
            const uint16_t* bp_hi = fused ? half_tiles(p + panels) : nullptr;
            if (tiles)
              block<true>(g, ablk, kp, bp, rb * kRows, p, p > p0, next_b, p == p0, nt, k0, k1, pacc, fused, bp_hi);
            else
              block_dp(g, ablk, kp, bp, rb * kRows, p, nt, k0, k1, pacc, fused, bp_hi);
            if (fused && k1 == kp) silu_to_a(pacc, g.m, rb * kRows, p, panels * 16, io.out_kp, io.silu_out);
          }
        }
        if (nt) _mm_sfence();  // the streamed stores are ordered by no atomic: publish them first
        if (g.epilogue && done[rb].fetch_add(1, std::memory_order_acq_rel) + 1 == row_items)
          g.epilogue(g.epilogue_ctx, rb * kRows, std::min(g.m, (rb + 1) * kRows));
      }
    }
    if (tiles) _tile_release();
  }
}

// Panels are dequantized a group at a time (up to kGroupBytes) into one buffer the
// threads share; then each thread runs its 32-row blocks of A against every panel of the group, so a block
// (32 x Kp bf16, 36 KB at K = 576) is loaded from memory once per group and read from L1 for the others,
// where whole panels against all of A would stream A (more than L2 at long prompts) once per panel.
// Rows are split between the threads; with few row blocks the group's panels are split too (slices), so
// every thread has work at any M.
template <int KIND>
void gemm_kind(const GemmArgs& g, bool silu) {
  const int64_t kp = (g.k + kKStep - 1) / kKStep * kKStep;
  const int64_t mp = (g.m + kRows - 1) / kRows * kRows;
  const int64_t panels = (g.n + kNR - 1) / kNR, nrb = mp / kRows;
  const int64_t panel_elems = kp * kNR;
  const int64_t group = std::clamp<int64_t>(kGroupBytes / (panel_elems * 2), 1, panels);
  const bool sb = streams_b(kp);
  if (g.tiles) return gemm_prepacked(g, kp, nrb, panels, silu);
  // Not value-initialized: convert_a writes every element, padding included, and zeroing it first would
  // be a serial memset of megabytes per prefill GEMM, with the other threads idle.
  // 64-byte aligned, as the tiles are read in rows of 64 bytes.
  std::unique_ptr<uint16_t[], decltype(&std::free)> abf((uint16_t*)std::aligned_alloc(64, mp * kp * 2), &std::free);
  convert_a(g, mp, kp, abf.get(), silu);
  uint16_t* bbuf = (uint16_t*)std::aligned_alloc(64, group * panel_elems * sizeof(uint16_t));
  const bool tiles = uses_tiles();
#pragma omp parallel
  {
    if (tiles) load_amx_tile_config();
    const int64_t nth = omp_get_num_threads();
    for (int64_t p0 = 0; p0 < panels; p0 += group) {
      const int64_t np = std::min(group, panels - p0);
#pragma omp for schedule(static)
      for (int64_t i = 0; i < np; ++i) {
        if constexpr (is_qkind(KIND))
          pack_panel_q<KIND>(g, p0 + i, bbuf + i * panel_elems);
        else
          pack_panel<KIND>(g, p0 + i, kp, bbuf + i * panel_elems);
      }
      const int64_t slices = std::min(np, (2 * nth + nrb - 1) / nrb);
      const int64_t per = (np + slices - 1) / slices;
#pragma omp for schedule(static)
      for (int64_t it = 0; it < nrb * slices; ++it) {
        const int64_t rb = it / slices, i1 = std::min(np, (it % slices + 1) * per);
        for (int64_t i = it % slices * per; i < i1; ++i) {
          const uint16_t *ablk = abf.get() + rb * kRows * kp, *bp = bbuf + i * panel_elems;
          if (!tiles)
            block_dp(g, ablk, kp, bp, rb * kRows, p0 + i, false, 0, -1, nullptr, false, nullptr);
          else if (sb)
            block<true>(g, ablk, kp, bp, rb * kRows, p0 + i);
          else
            block<false>(g, ablk, kp, bp, rb * kRows, p0 + i);
        }
      }  // the loop's barrier: the next group's packing overwrites bbuf
    }
    if (tiles) _tile_release();
  }
  std::free(bbuf);
  if (g.epilogue) g.epilogue(g.epilogue_ctx, 0, g.m);
}

}  // namespace

namespace amx {

bool has_avx512_bf16() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
         __builtin_cpu_supports("avx512bf16");
}

bool usable() {
  // The kernel must grant this process the AMX tile state (Linux >= 5.16); without it the first tile
  // instruction faults, so AMX is used only when the CPU has it and the request succeeded.
  static const bool ok = [] {
    if (!has_avx512_bf16()) return false;
    unsigned eax, ebx, ecx, edx;
    __asm__("cpuid" : "=a"(eax), "=b"(ebx), "=c"(ecx), "=d"(edx) : "a"(7), "c"(0));
    const bool amx_bf16 = edx & (1u << 22), amx_tile = edx & (1u << 24);
    if (!amx_bf16 || !amx_tile) return false;
    constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
    return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
  }();
  return ok;
}

static void gemm_any(const GemmArgs& g, bool silu) {
  switch (g.kind) {
    case kS8:
      return gemm_kind<kS8>(g, silu);
    case kU4:
      return gemm_kind<kU4>(g, silu);
    case kQ4_0:
      return gemm_kind<kQ4_0>(g, silu);
    case kQ4_1:
      return gemm_kind<kQ4_1>(g, silu);
    default:
      return gemm_kind<kQ8_0>(g, silu);
  }
}

void gemm_bf16(const GemmArgs& g) { gemm_any(g, false); }

void gemm_bf16_silu_mul(const GemmArgs& g) { gemm_any(g, true); }

void gemm_gate_up_silu_down(const GemmArgs& gate_up, const GemmArgs& down) {
  const int64_t kp = (gate_up.k + kKStep - 1) / kKStep * kKStep, kpd = (down.k + kKStep - 1) / kKStep * kKStep;
  const int64_t nrb = (gate_up.m + kRows - 1) / kRows;
  // Every element is written by the gate_up call (silu_to_a) before the down call reads it.
  std::unique_ptr<uint16_t[], decltype(&std::free)> a(alloc_a_tiles(nrb * kRows * kpd), &std::free);
  gemm_prepacked(gate_up, kp, nrb, down.k / 16, false, TileIo{nullptr, a.get(), kpd});
  gemm_prepacked(down, kpd, nrb, (down.n + kNR - 1) / kNR, false, TileIo{a.get(), nullptr, 0});
}

template <int KIND>
void pack_kind(const GemmArgs& g, uint16_t* out) {
  const int64_t kp = (g.k + kKStep - 1) / kKStep * kKStep, panels = (g.n + kNR - 1) / kNR;
#pragma omp parallel for schedule(static)
  for (int64_t p = 0; p < panels; ++p) {
    if constexpr (is_qkind(KIND))
      pack_panel_q<KIND>(g, p, out + p * kp * kNR);
    else
      pack_panel<KIND>(g, p, kp, out + p * kp * kNR);
  }
}

int64_t tiles_elems(int64_t n, int64_t k) { return (n + kNR - 1) / kNR * ((k + kKStep - 1) / kKStep * kKStep) * kNR; }

void pack_tiles(const GemmArgs& g, uint16_t* out) {
  switch (g.kind) {
    case kS8:
      return pack_kind<kS8>(g, out);
    case kU4:
      return pack_kind<kU4>(g, out);
    case kQ4_0:
      return pack_kind<kQ4_0>(g, out);
    case kQ4_1:
      return pack_kind<kQ4_1>(g, out);
    default:
      return pack_kind<kQ8_0>(g, out);
  }
}

void round_rows_bf16(const float* a, int64_t m, int64_t k, int64_t lda, float* out) {
  for (int64_t r = 0; r < m; ++r) {
    const float* x = a + r * lda;
    float* o = out + r * k;
    int64_t i = 0;
    for (; i + 16 <= k; i += 16) _mm512_storeu_si512(o + i, round_hi(_mm512_loadu_ps(x + i)));
    for (; i < k; ++i) {
      const uint32_t u = (uint32_t)round_scalar(x[i]) << 16;
      std::memcpy(o + i, &u, 4);
    }
  }
}

}  // namespace amx

#pragma GCC pop_options

}  // namespace fdk
