// Vectorized exp and the silu built on it, shared by kern_impl.h, sampler_impl.h, encoder_impl.h and
// amx.cc. Included inside an ISA namespace after simd.h (FD_W defined). No include guard on purpose: each
// ISA namespace gets its own copy.

#if FD_W == 16 || FD_W == 8
// exp for x <= 88: Cephes-style range reduction x = n*ln2 + r, degree-6 polynomial, 2^n built in the
// exponent bits (x is clamped to [-87.3, 88.3] so n stays a normal exponent). Relative error ~2e-7.
static inline vf vexp(vf x) {
  x = vmax(x, vset1(-87.33654f));
#if FD_W == 16
  x = _mm512_min_ps(x, vset1(88.37626f));
  vf n = _mm512_roundscale_ps(vmul(x, vset1(1.44269504f)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
#else
  x = _mm256_min_ps(x, vset1(88.37626f));
  vf n = _mm256_round_ps(vmul(x, vset1(1.44269504f)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
#endif
  vf r = vfma(n, vset1(-0.693359375f), x);
  r = vfma(n, vset1(2.12194440e-4f), r);
  vf p = vset1(1.9875691500e-4f);
  p = vfma(p, r, vset1(1.3981999507e-3f));
  p = vfma(p, r, vset1(8.3334519073e-3f));
  p = vfma(p, r, vset1(4.1665795894e-2f));
  p = vfma(p, r, vset1(1.6666665459e-1f));
  p = vfma(p, r, vset1(5.0000001201e-1f));
  p = vfma(vmul(p, r), r, vadd(r, vset1(1.0f)));
#if FD_W == 16
  return _mm512_scalef_ps(p, n);
#else
  __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return vmul(p, _mm256_castsi256_ps(e));
#endif
}
#else
static inline vf vexp(vf x) { return std::exp(x); }
#endif

// 2^t for the online softmax, where t <= 8 (a lazy running max lags the scores by up to 8; t = -inf
// gives 0): t = n + f with n = round(t), |f| <= 1/2, and 2^f by a degree-5 polynomial with constant term
// 1, fitted for relative error over [-1/2, 1/2] (its fp32 Horner evaluation stays within 1.7e-7 of 2^f),
// scaled by 2^n in the exponent. 2^0 is exactly 1, so an online softmax whose running max did not move
// rescales by exactly 1. t is clamped at -1000 first: 2^n then rounds to exactly 0 and -inf never reaches
// f = t - n. Relative error <= 3e-7 for t >= -126; below that the result is a denormal or 0 (an absolute
// error under 2^-126). Nine vector operations against vexp's fifteen, whose range reduction for x up to
// +88 the softmax does not need.
#if FD_W == 16 || FD_W == 8
static inline vf vexp2_nonpos(vf t) {
  t = vmax(t, vset1(-1000.0f));
#if FD_W == 16
  const vf n = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
#else
  const vf n = _mm256_round_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
#endif
  const vf f = vsub(t, n);
  vf p = vset1(1.3264709850773215e-3f);
  p = vfma(p, f, vset1(9.671507403254509e-3f));
  p = vfma(p, f, vset1(5.550733581185341e-2f));
  p = vfma(p, f, vset1(2.4022242426872253e-1f));
  p = vfma(p, f, vset1(6.931470036506653e-1f));
  p = vfma(p, f, vset1(1.0f));
#if FD_W == 16
  return _mm512_scalef_ps(p, n);
#else
  // 2^n in the exponent bits, in two factors so that n down to -1000 stays in range of each: n / 2
  // and n - n / 2 are each >= -500, clamped at -127 (the factor is then 0, and so is the product).
  const __m256i ni = _mm256_cvtps_epi32(n), h = _mm256_srai_epi32(ni, 1), bias = _mm256_set1_epi32(127);
  const __m256i e0 = _mm256_max_epi32(_mm256_add_epi32(h, bias), _mm256_setzero_si256());
  const __m256i e1 = _mm256_max_epi32(_mm256_add_epi32(_mm256_sub_epi32(ni, h), bias), _mm256_setzero_si256());
  return vmul(vmul(p, _mm256_castsi256_ps(_mm256_slli_epi32(e0, 23))), _mm256_castsi256_ps(_mm256_slli_epi32(e1, 23)));
#endif
}
#else
static inline vf vexp2_nonpos(vf t) { return std::exp2(t); }
#endif

// silu(a) * up, in the one order silu_and_mul (kern_impl.h), the decode region and amx.cc's fused
// down_proj input all use: the fused conversion must round the very value the op would have stored.
// With e = exp(-|a|) in (0, 1]: silu(a) = a / (1 + e) for a >= 0 and a e / (1 + e) for a < 0, so the
// exponential never overflows and the divisor stays in [1, 2] (no inf / inf, no clamp). e is 2^t with
// t = -|a| log2(e) rounded to fp32, which costs a relative error of |a| (2^-24 + 1.3e-8) in e; the
// polynomial adds <= 3e-7. Relative error of the result: <= 5e-7 + 7.3e-8 |a| for -87 <= a < 0 (where
// |silu(a)| <= 0.28, and below a = -25 the value is under 4e-10 |up|; below -87 it is a denormal or 0,
// off by under 2^-126 |a up|), <= 5e-7 for a >= 0, where the error of e is damped by e / (1 + e) <= 1/2.
// -0 gives -0 * up, NaN gives NaN, +inf gives inf * up, -inf gives NaN (-inf * 0, as x * sigmoid(x)).
#if FD_W == 16 || FD_W == 8
// 2^f for f in [0, 1]: a degree-5 polynomial fitted for relative error (7.5e-8; ~1.5e-7 in fp32 Horner).
static inline vf vexp2_unit(vf f) {
  vf p = vset1(1.877572271041572e-3f);
  p = vfma(p, f, vset1(8.98935180157423e-3f));
  p = vfma(p, f, vset1(5.582630634307861e-2f));
  p = vfma(p, f, vset1(2.4015362560749054e-1f));
  p = vfma(p, f, vset1(6.931530833244324e-1f));
  return vfma(p, f, vset1(9.999999403953552e-1f));
}
#if FD_W == 16
// 2^t for finite t (a caller clamps -inf and NaN first): t = floor(t) + f, f in [0, 1) from one
// vreduceps, 2^f from vexp2_unit, times 2^floor(t) by vscalefps, exact for any sign (a denormal or 0
// below 2^-126). The silu below and the AMX prompt softmax's weights (attn_amx.h) both take it.
static inline vf vexp2_scalef(vf t) {
  return _mm512_scalef_ps(vexp2_unit(_mm512_reduce_ps(t, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC)), t);
}
#endif
// exp(-|a|) = 2^t, t = -|a| log2(e) = floor(t) + f, f in [0, 1). AVX-512: vexp2_scalef (t = NaN or below
// -1000 is taken as -1000). AVX2: 2^floor(t) in the exponent bits, t clamped at -127 first, whose exponent
// field 0 makes it 0.
static inline vf vexp_neg_abs(vf a) {
#if FD_W == 16
  return vexp2_scalef(vmax(vmul(_mm512_or_ps(a, vset1(-0.0f)), vset1(1.44269504f)), vset1(-1000.0f)));
#else
  const vf t = vmax(vmul(_mm256_or_ps(a, vset1(-0.0f)), vset1(1.44269504f)), vset1(-127.0f));
  const vf n = _mm256_floor_ps(t);
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return vmul(vexp2_unit(vsub(t, n)), _mm256_castsi256_ps(e));
#endif
}
// a e where a's sign bit is set (-0 included), else a; times up, over 1 + e.
static inline vf vsilu_mul(vf a, vf up) {
  const vf e = vexp_neg_abs(a);
#if FD_W == 16
  const vf num = _mm512_mask_mul_ps(a, _mm512_movepi32_mask(_mm512_castps_si512(a)), a, e);
#else
  const vf num = _mm256_blendv_ps(a, vmul(a, e), a);
#endif
  return vmul(num, up) / vadd(vset1(1.0f), e);
}
#endif
// The same for a row's last n % FD_W values, and for every value at the scalar ISA level: std::exp and
// the divide, a divided before the product with up (a * up first would overflow for a = -3e38).
static inline float silu_mul_tail(float a, float up) { return a / (1.0f + std::exp(-a)) * up; }
#if FD_W == 1
static inline vf vsilu_mul(vf a, vf up) { return silu_mul_tail(a, up); }
#endif
