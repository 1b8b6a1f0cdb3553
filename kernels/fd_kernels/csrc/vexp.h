// Vectorized exp, shared by kern_impl.h and sampler_impl.h. Included inside an ISA namespace after
// simd.h (FD_W defined). No include guard on purpose: each ISA namespace gets its own copy.

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
