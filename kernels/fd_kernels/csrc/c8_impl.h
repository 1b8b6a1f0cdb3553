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

// The C8 rule over `rows` contiguous rows of hd values (a KV offload block): codes q and scales s.
static void kv_s8_quantize(const float* x, int64_t rows, int64_t hd, int8_t* q, float* s) {
  for (int64_t r = 0; r < rows; ++r) quantize_row_s8(x + r * hd, hd, q + r * hd, s + r);
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
