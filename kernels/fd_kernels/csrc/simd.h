// Width-generic vector helpers. Included once per ISA namespace by kernels.cc with FD_W defined as
// 16 (AVX-512), 8 (AVX2+FMA) or 1 (scalar). Every kernel in kern_impl.h is written against these, so the
// three paths share one source and the tests can compare them.
// No include guard on purpose: each ISA namespace gets its own copy.

#if FD_W == 16
typedef __m512 vf;
static inline vf vzero() { return _mm512_setzero_ps(); }
static inline vf vload(const float* p) { return _mm512_loadu_ps(p); }
static inline void vstore(float* p, vf v) { _mm512_storeu_ps(p, v); }
static inline vf vset1(float x) { return _mm512_set1_ps(x); }
static inline vf vfma(vf a, vf b, vf c) { return _mm512_fmadd_ps(a, b, c); }
static inline vf vadd(vf a, vf b) { return _mm512_add_ps(a, b); }
static inline vf vsub(vf a, vf b) { return _mm512_sub_ps(a, b); }
static inline vf vmul(vf a, vf b) { return _mm512_mul_ps(a, b); }
static inline vf vmax(vf a, vf b) { return _mm512_max_ps(a, b); }
static inline float vhsum(vf v) { return _mm512_reduce_add_ps(v); }
// s where key_pos <= limit (lane-wise), else -inf: the causal mask.
static inline vf vmask_le(vf s, float key_pos, vf limit) {
  return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(vset1(key_pos), limit, _CMP_LE_OQ), vset1(-INFINITY), s);
}
// 16 int8 -> 16 floats.
static inline vf vload_s8(const int8_t* p) {
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)p)));
}
// 16 bytes -> their low (shift 0) or high (shift 4) nibbles as floats.
static inline vf vload_u4(const uint8_t* p, int shift) {
  __m512i b = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)p));
  return _mm512_cvtepi32_ps(_mm512_and_si512(_mm512_srli_epi32(b, shift), _mm512_set1_epi32(15)));
}
// Round to bf16 (nearest even), kept as fp32: the formula amx.cc uses, so both paths see equal operands.
static inline vf vround_bf16(vf x) {
  const __m512i u = _mm512_castps_si512(x);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  const __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7FFF)));
  return _mm512_castsi512_ps(_mm512_and_si512(r, _mm512_set1_epi32((int)0xFFFF0000u)));
}
#elif FD_W == 8
typedef __m256 vf;
static inline vf vzero() { return _mm256_setzero_ps(); }
static inline vf vload(const float* p) { return _mm256_loadu_ps(p); }
static inline void vstore(float* p, vf v) { _mm256_storeu_ps(p, v); }
static inline vf vset1(float x) { return _mm256_set1_ps(x); }
static inline vf vfma(vf a, vf b, vf c) { return _mm256_fmadd_ps(a, b, c); }
static inline vf vadd(vf a, vf b) { return _mm256_add_ps(a, b); }
static inline vf vsub(vf a, vf b) { return _mm256_sub_ps(a, b); }
static inline vf vmul(vf a, vf b) { return _mm256_mul_ps(a, b); }
static inline vf vmax(vf a, vf b) { return _mm256_max_ps(a, b); }
static inline float vhsum(vf v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
static inline vf vmask_le(vf s, float key_pos, vf limit) {
  return _mm256_blendv_ps(vset1(-INFINITY), s, _mm256_cmp_ps(vset1(key_pos), limit, _CMP_LE_OQ));
}
static inline vf vload_s8(const int8_t* p) {
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i*)p)));
}
static inline vf vload_u4(const uint8_t* p, int shift) {
  __m256i b = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)p));
  return _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srli_epi32(b, shift), _mm256_set1_epi32(15)));
}
#else
typedef float vf;
static inline vf vzero() { return 0.0f; }
static inline vf vload(const float* p) { return *p; }
static inline void vstore(float* p, vf v) { *p = v; }
static inline vf vset1(float x) { return x; }
static inline vf vfma(vf a, vf b, vf c) { return a * b + c; }
static inline vf vadd(vf a, vf b) { return a + b; }
static inline vf vsub(vf a, vf b) { return a - b; }
static inline vf vmul(vf a, vf b) { return a * b; }
static inline vf vmax(vf a, vf b) { return a > b ? a : b; }
static inline float vhsum(vf v) { return v; }
static inline vf vmask_le(vf s, float key_pos, vf limit) { return key_pos <= limit ? s : -INFINITY; }
static inline vf vload_s8(const int8_t* p) { return (float)*p; }
static inline vf vload_u4(const uint8_t* p, int shift) { return (float)((*p >> shift) & 15); }
#endif
