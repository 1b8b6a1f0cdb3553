// The C8 KV cache (--kv-cache-dtype int8), included by attn_impl.h inside an ISA namespace.
//
// Each cached (token, KV head) row of head_dim values is stored as int8 plus one fp32 scale, kept in
// k_scales / v_scales [num_blocks, nkv, block_size] beside the caches:
//   scale = max_d |x[d]| / 127 (1 if that is 0),  q[d] = clamp(round_half_even(x[d] / scale), -127, 127),
//   read back as q[d] * scale.
// Per token and head, symmetric: no calibration, a token's codes depend on that token alone (so prefix
// caching and batching cannot change them), and the error is at most scale / 2 = absmax / 254 per element.
// fd_kernels/reference computes the same codes and scales bit for bit: fp32 division and
// round-half-even (the default rounding mode) are exact IEEE operations in both.
// No include guard on purpose.

static inline void quantize_row_s8(const float* x, int64_t hd, int8_t* q, float* scale) {
  float amax = 0.0f;
  for (int64_t d = 0; d < hd; ++d) amax = std::max(amax, std::fabs(x[d]));
  float s = amax / 127.0f;
  if (s == 0.0f) s = 1.0f;  // an all-zero row (or one that underflows): codes 0 either way
  for (int64_t d = 0; d < hd; ++d) q[d] = (int8_t)std::min(127.0f, std::max(-127.0f, std::nearbyint(x[d] / s)));
  *scale = s;
}

static void reshape_and_cache_s8(const float* k, const float* v, int8_t* kc, int8_t* vc, float* ks, float* vs,
                                 const int64_t* slots, int64_t t, int64_t nkv, int64_t bs, int64_t hd) {
  for_each_cache_row(slots, t, nkv, bs, hd, t * nkv * hd >= (1 << 16), [&](int64_t src, int64_t row) {
    quantize_row_s8(k + src, hd, kc + row * hd, ks + row);
    quantize_row_s8(v + src, hd, vc + row * hd, vs + row);
  });
}

// quantize_row_s8 with the max, the division and the rounding in vector lanes: bit-equal, since max,
// IEEE division and round-half-even are exact in every lane. A row holding a NaN or an infinity, or
// whose length is not a multiple of the vector width, takes quantize_row_s8 itself.
static inline void quantize_row_s8_vec(const float* x, int64_t hd, int8_t* q, float* scale) {
#if FD_W > 1
  if (hd % FD_W == 0) {
    vf amax = vzero(), nonfinite = vzero();
    for (int64_t d = 0; d < hd; d += FD_W) {
      const vf v = vload(x + d);
      amax = vmax(amax, vmax(v, vsub(vzero(), v)));
      nonfinite = vadd(nonfinite, vmul(v, vzero()));  // NaN iff a lane saw a NaN or an infinity
    }
    float lanes[FD_W], flags[FD_W], a = 0.0f;
    vstore(lanes, amax);
    vstore(flags, nonfinite);
    bool finite = true;
    for (int j = 0; j < FD_W; ++j) {
      a = std::max(a, lanes[j]);
      finite = finite && flags[j] == 0.0f;
    }
    if (finite) {
      float s = a / 127.0f;
      if (s == 0.0f) s = 1.0f;
      const vf vs = vset1(s);
      for (int64_t d = 0; d < hd; d += FD_W) {
#if FD_W == 16
        __m512 r = _mm512_roundscale_ps(_mm512_div_ps(vload(x + d), vs), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        r = _mm512_min_ps(_mm512_max_ps(r, vset1(-127.0f)), vset1(127.0f));
        _mm_storeu_si128((__m128i*)(q + d), _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(r)));
#else
        __m256 r = _mm256_round_ps(_mm256_div_ps(vload(x + d), vs), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        r = _mm256_min_ps(_mm256_max_ps(r, vset1(-127.0f)), vset1(127.0f));
        const __m256i i32 = _mm256_cvtps_epi32(r);  // integral already: exact
        const __m128i i16 = _mm_packs_epi32(_mm256_castsi256_si128(i32), _mm256_extracti128_si256(i32, 1));
        _mm_storel_epi64((__m128i*)(q + d), _mm_packs_epi16(i16, i16));
#endif
      }
      *scale = s;
      return;
    }
  }
#endif
  quantize_row_s8(x, hd, q, scale);
}

// The C8 rule over `rows` contiguous rows of hd values (a KV offload block): codes q and scales s.
static void kv_s8_quantize(const float* x, int64_t rows, int64_t hd, int8_t* q, float* s) {
  for (int64_t r = 0; r < rows; ++r) quantize_row_s8_vec(x + r * hd, hd, q + r * hd, s + r);
}

// n consecutive cached rows of hd codes, times their scales, into out (fp32, same layout).
static inline void dequant_rows(const int8_t* q, const float* s, int64_t n, int64_t hd, float* out) {
  for (int64_t j = 0; j < n; ++j) {
    const int8_t* qj = q + j * hd;
    float* oj = out + j * hd;
    const vf sj = vset1(s[j]);
    int64_t d = 0;
    for (; d + FD_W <= hd; d += FD_W) vstore(oj + d, vmul(vload_s8(qj + d), sj));
    for (; d < hd; ++d) oj[d] = (float)qj[d] * s[j];
  }
}

// The inverse for a KV offload block: out[r, d] = q[r, d] * s[r], written straight into `out`.
static void kv_s8_dequantize(const int8_t* q, const float* s, int64_t rows, int64_t hd, float* out) {
  dequant_rows(q, s, rows, hd, out);
}

// The same for a bf16 pool's rows (their bits): widened exactly before the rule; restored values rounded
// to bf16 as the bf16 cache rounds them (bf16_impl.h).
static void kv_s8_quantize_bf16(const uint16_t* x, int64_t rows, int64_t hd, int8_t* q, float* s) {
  std::vector<float> row(hd);
  for (int64_t r = 0; r < rows; ++r) {
    widen_bf16(x + r * hd, hd, row.data());
    quantize_row_s8_vec(row.data(), hd, q + r * hd, s + r);
  }
}

static void kv_s8_dequantize_bf16(const int8_t* q, const float* s, int64_t rows, int64_t hd, uint16_t* out) {
  std::vector<float> row(hd);
  for (int64_t r = 0; r < rows; ++r) {
    dequant_rows(q + r * hd, s + r, 1, hd, row.data());
    round_row_bf16(row.data(), hd, out + r * hd);
  }
}
