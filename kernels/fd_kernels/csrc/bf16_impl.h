// The bf16 KV cache (--kv-cache-dtype bfloat16), included by attn_impl.h inside an ISA namespace.
//
// Each cached value is the fp32 value rounded to bf16 (nearest even, simd.h bf16_bits), stored as its 16
// bits in a Paddle bfloat16 tensor [num_blocks, nkv, block_size, head_dim]; no scales. Reading widens
// exactly (bits << 16), so attention over a bf16 cache is fp32 attention over the rounded K/V: half the
// bytes of the fp32 cache, at most 2^-8 relative error per element (8 significant bits). A value depends
// on itself alone, so batching and prefix caching cannot change what is cached.
// fd_kernels/reference writes the same bits with Paddle's cast (round to nearest even, NaN ->
// 0x7FFF).
// No include guard on purpose.

static inline void round_row_bf16(const float* x, int64_t n, uint16_t* out) {
  int64_t d = 0;
  for (; d + FD_W <= n; d += FD_W) vstore_bf16(out + d, vload(x + d));
  for (; d < n; ++d) out[d] = bf16_bits(x[d]);
}

static void reshape_and_cache_bf16(const float* k, const float* v, uint16_t* kc, uint16_t* vc,
                                   const int64_t* slots, int64_t t, int64_t nkv, int64_t bs, int64_t hd) {
  for_each_cache_row(slots, t, nkv, bs, hd, t * nkv * hd >= (1 << 16), [&](int64_t src, int64_t row) {
    round_row_bf16(k + src, hd, kc + row * hd);
    round_row_bf16(v + src, hd, vc + row * hd);
  });
}

// n consecutive bf16 values widened to fp32 into out.
static inline void widen_bf16(const uint16_t* x, int64_t n, float* out) {
  int64_t e = 0;
  for (; e + FD_W <= n; e += FD_W) vstore(out + e, vload_bf16(x + e));
  for (; e < n; ++e) out[e] = bf16_float(x[e]);
}
