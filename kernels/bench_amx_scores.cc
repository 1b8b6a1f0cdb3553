// A probe, not a kernel: the decode scores of one GQA group (3 rows, hd 64) against 16-key bf16 sub-chunks,
// as dots16_rows computed them before it paired keys (FMAs on widened keys, a shuffle tree per key) and on
// the AMX tiles (the keys straight from the cache as A, q's exact three bf16 parts as resident B tiles, the
// parts summed in the fp32 accumulator). Keys in L2 (512 keys), TSC cycles per key per group, and each way's largest error
// against a float64 dot product. Build and run (from the repo root, on an AMX CPU):
//   g++ -O3 -std=c++17 kernels/bench_amx_scores.cc -o /tmp/bench_amx_scores && /tmp/bench_amx_scores
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <x86intrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

constexpr int kHd = 64, kRows = 3;

static uint16_t round_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return (uint16_t)((u + 0x7FFF + ((u >> 16) & 1)) >> 16);
}
static uint16_t trunc_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return (uint16_t)(u >> 16);
}
static float widen(uint16_t h) {
  const uint32_t u = (uint32_t)h << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// dots16_rows<3, bf16> of attn_impl.h before it paired keys, without the prefetches: scores into sc rows 64 apart.
__attribute__((target("avx512f,avx512bw"))) static void fma_scores(const float* const* qr, const uint16_t* kp,
                                                                    float* sc) {
  const __m512i odd = _mm512_set_epi16(15, 0, 14, 0, 13, 0, 12, 0, 11, 0, 10, 0, 9, 0, 8, 0, 7, 0, 6, 0, 5, 0, 4, 0, 3,
                                       0, 2, 0, 1, 0, 0, 0);
  for (int half = 0; half < 2; ++half) {
    __m512 acc[kRows][8];
    for (auto& row : acc)
      for (auto& a : row) a = _mm512_setzero_ps();
    for (int d = 0; d < kHd; d += 16) {
      __m512 qv[kRows];
      for (int r = 0; r < kRows; ++r) qv[r] = _mm512_loadu_ps(qr[r] + d);
      for (int j = 0; j < 8; ++j) {
        const __m256i x = _mm256_loadu_si256((const __m256i*)(kp + (half * 8 + j) * kHd + d));
        const __m512 kv = _mm512_castsi512_ps(_mm512_maskz_permutexvar_epi16(0xAAAAAAAAu, odd, _mm512_castsi256_si512(x)));
        for (int r = 0; r < kRows; ++r) acc[r][j] = _mm512_fmadd_ps(qv[r], kv, acc[r][j]);
      }
    }
    for (int r = 0; r < kRows; ++r) {
      __m512 t[4], s2[2];
      for (int i = 0; i < 4; ++i)
        t[i] = _mm512_add_ps(_mm512_shuffle_f32x4(acc[r][i], acc[r][i + 4], 0x44),
                             _mm512_shuffle_f32x4(acc[r][i], acc[r][i + 4], 0xEE));
      for (int i = 0; i < 2; ++i)
        s2[i] = _mm512_add_ps(_mm512_shuffle_f32x4(t[i], t[i + 2], 0x88), _mm512_shuffle_f32x4(t[i], t[i + 2], 0xDD));
      const __m512 u = _mm512_add_ps(_mm512_unpacklo_ps(s2[0], s2[1]), _mm512_unpackhi_ps(s2[0], s2[1]));
      const __m512 w = _mm512_add_ps(u, _mm512_permute_ps(u, 0x4E));
      const __m512i order = _mm512_setr_epi32(0, 1, 8, 9, 4, 5, 12, 13, 0, 0, 0, 0, 0, 0, 0, 0);
      _mm256_storeu_ps(sc + r * 64 + half * 8, _mm512_castps512_ps256(_mm512_permutexvar_ps(order, w)));
    }
  }
}

struct TileConfig {
  uint8_t palette_id, start_row, reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
};

// Tiles: 0 = C (16 keys x 3 rows fp32), 1 = A (16 keys x 32 dims), 2-7 = B (slice s, part p at 2 + 3s + p:
// 16 dim pairs x 3 rows). C is stored as [key][row] and each row's 16 scores gathered by two permutes.
__attribute__((target("amx-tile,amx-bf16,avx512f"))) static void amx_scores(const uint16_t* b, const uint16_t* kc,
                                                                             int64_t nsub, int reps, float* sc) {
  TileConfig cfg{};
  cfg.palette_id = 1;
  for (int t = 0; t < 8; ++t) {
    cfg.rows[t] = 16;
    cfg.colsb[t] = t == 1 ? 64 : 4 * kRows;
  }
  asm volatile("" : : "r"(&cfg) : "memory");  // see amx_tiles.h
  _tile_loadconfig(&cfg);
  _tile_loadd(2, b + 0 * 96, 12);
  _tile_loadd(3, b + 1 * 96, 12);
  _tile_loadd(4, b + 2 * 96, 12);
  _tile_loadd(5, b + 3 * 96, 12);
  _tile_loadd(6, b + 4 * 96, 12);
  _tile_loadd(7, b + 5 * 96, 12);
  alignas(64) float c[16 * kRows];
  const __m512i step3 = _mm512_setr_epi32(0, 3, 6, 9, 12, 15, 18, 21, 24, 27, 30, 33, 36, 39, 42, 45);
  for (int rep = 0; rep < reps; ++rep)
    for (int64_t s = 0; s < nsub; ++s) {
      const uint16_t* k = kc + s * 16 * kHd;
      _tile_zero(0);
      _tile_loadd(1, k, kHd * 2);
      _tile_dpbf16ps(0, 1, 2);
      _tile_dpbf16ps(0, 1, 3);
      _tile_dpbf16ps(0, 1, 4);
      _tile_loadd(1, k + 32, kHd * 2);
      _tile_dpbf16ps(0, 1, 5);
      _tile_dpbf16ps(0, 1, 6);
      _tile_dpbf16ps(0, 1, 7);
      _tile_stored(0, c, 4 * kRows);
      const __m512 x = _mm512_load_ps(c), y = _mm512_load_ps(c + 16), z = _mm512_load_ps(c + 32);
      float* o = sc + (s % 4) * 16;
      for (int r = 0; r < kRows; ++r) {  // row r's score of key j is c[3 j + r]: from (x, y) below 32, else z
        const __m512i idx = _mm512_add_epi32(step3, _mm512_set1_epi32(r));
        const __mmask16 hi = _mm512_cmpge_epi32_mask(idx, _mm512_set1_epi32(32));
        const __m512 xy = _mm512_permutex2var_ps(x, idx, y);
        _mm512_storeu_ps(o + r * 64, _mm512_mask_permutexvar_ps(xy, hi, _mm512_sub_epi32(idx, _mm512_set1_epi32(32)), z));
      }
    }
  _tile_release();
}

int main() {
  if (syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */) != 0) {
    std::printf("no AMX\n");
    return 1;
  }
  const int64_t nsub = 32;  // 512 keys, 64 KiB
  std::mt19937 rng(1);
  std::normal_distribution<float> dist;
  std::vector<uint16_t> kc(nsub * 16 * kHd);
  for (auto& v : kc) v = round_bf16(dist(rng));
  std::vector<float> q(kRows * kHd);
  for (auto& v : q) v = 3.0f * dist(rng);
  const float* qr[kRows] = {q.data(), q.data() + kHd, q.data() + 2 * kHd};
  // B: slice s, part p, dim pair k, row r: (part p of q_r[32 s + 2 k], of q_r[32 s + 2 k + 1]). The parts are
  // exact: each is the remainder's leading 8 bits, and three cover fp32's 24.
  std::vector<uint16_t> b(6 * 96);
  for (int s = 0; s < 2; ++s)
    for (int k = 0; k < 16; ++k)
      for (int r = 0; r < kRows; ++r)
        for (int e = 0; e < 2; ++e) {
          float x = q[r * kHd + s * 32 + 2 * k + e];
          for (int p = 0; p < 3; ++p) {
            const uint16_t h = trunc_bf16(x);
            b[(s * 3 + p) * 96 + k * 6 + r * 2 + e] = h;
            x -= widen(h);
          }
        }
  std::vector<float> s1(kRows * 64), s2(kRows * 64);
  for (int64_t s = 0; s < 4; ++s) fma_scores(qr, kc.data() + s * 16 * kHd, s1.data() + s * 16);
  amx_scores(b.data(), kc.data(), 4, 1, s2.data());
  double e1 = 0, e2 = 0;
  for (int r = 0; r < kRows; ++r)
    for (int j = 0; j < 64; ++j) {
      double ref = 0;
      for (int d = 0; d < kHd; ++d) ref += (double)q[r * kHd + d] * widen(kc[j * kHd + d]);
      e1 = std::max(e1, std::fabs(s1[r * 64 + j] - ref));
      e2 = std::max(e2, std::fabs(s2[r * 64 + j] - ref));
    }
  std::printf("largest |score - float64|: FMA %.3g, AMX %.3g\n", e1, e2);
  for (int pass = 0; pass < 5; ++pass) {
    const int reps = 2000;
    const uint64_t t0 = __rdtsc();
    for (int rep = 0; rep < reps; ++rep)
      for (int64_t s = 0; s < nsub; ++s) fma_scores(qr, kc.data() + s * 16 * kHd, s1.data() + (s % 4) * 16);
    const uint64_t t1 = __rdtsc();
    amx_scores(b.data(), kc.data(), nsub, reps, s2.data());
    const uint64_t t2 = __rdtsc();
    const double keys = (double)reps * nsub * 16;
    std::printf("scores, TSC cycles per key per group: FMA %.2f  AMX %.2f\n", (t1 - t0) / keys, (t2 - t1) / keys);
  }
  return 0;
}
