// Width-generic vector helpers. Included once per ISA namespace by kernels.cc with FD_W defined as
// 16 (AVX-512), 8 (AVX2+FMA) or 1 (scalar). Every kernel in kern_impl.h is written against these, so the
// three paths share one source and the tests can compare them.
// No include guard on purpose: each ISA namespace gets its own copy. Includers provide <cstring>.

// bf16 as the bf16 KV cache stores it (bf16_impl.h): the top 16 bits of the fp32 value rounded to nearest
// even; NaN becomes 0x7FFF, the quiet NaN Paddle's fp32 -> bf16 cast gives (so the pure-Paddle reference
// writes the same bits). Reading back is exact: the bits shifted up.
static inline uint16_t bf16_bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return 0x7FFF;
  return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}
static inline float bf16_float(uint16_t b) {
  const uint32_t u = (uint32_t)b << 16;
  float x;
  std::memcpy(&x, &u, sizeof x);
  return x;
}

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
static inline float vhmax(vf v) { return _mm512_reduce_max_ps(v); }
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
// 16 bf16 -> 16 floats (exact: zero-extend, shift into the high half).
static inline vf vload_bf16(const uint16_t* p) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)p)), 16));
}
// 16 floats -> 16 bf16, bf16_bits lane-wise.
static inline void vstore_bf16(uint16_t* p, vf x) {
  const __m512i u = _mm512_castps_si512(x);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7FFF))), 16);
  r = _mm512_mask_mov_epi32(r, _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), _mm512_set1_epi32(0x7FFF));
  _mm256_storeu_si256((__m256i*)p, _mm512_cvtepi32_epi16(r));
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
static inline float vhmax(vf v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_movehdup_ps(m));
  return _mm_cvtss_f32(m);
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
static inline vf vload_bf16(const uint16_t* p) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i*)p)), 16));
}
static inline void vstore_bf16(uint16_t* p, vf x) {
  const __m256i u = _mm256_castps_si256(x);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  __m256i r = _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7FFF))), 16);
  r = _mm256_blendv_epi8(r, _mm256_set1_epi32(0x7FFF), _mm256_castps_si256(_mm256_cmp_ps(x, x, _CMP_UNORD_Q)));
  // Lanes hold 0..0xFFFF, which the signed-to-unsigned saturating pack keeps exactly.
  _mm_storeu_si128((__m128i*)p, _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1)));
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
static inline float vhmax(vf v) { return v; }
static inline vf vmask_le(vf s, float key_pos, vf limit) { return key_pos <= limit ? s : -INFINITY; }
static inline vf vload_s8(const int8_t* p) { return (float)*p; }
static inline vf vload_u4(const uint8_t* p, int shift) { return (float)((*p >> shift) & 15); }
static inline vf vload_bf16(const uint16_t* p) { return bf16_float(*p); }
static inline void vstore_bf16(uint16_t* p, vf x) { *p = bf16_bits(x); }
#endif
