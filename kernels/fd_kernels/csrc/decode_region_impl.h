// The ISA-level steps of the decode region (decode_region.h's fdk::region, dispatched by kernels.cc).
// Included by kernels.cc after kern_impl.h inside each ISA namespace; no include guard. Each is the per-op
// kernel's per-row (or per-item) body, called without the kernel's own parallel region.

static bool region_attn_fits(int64_t group) { return group < kMinLaneRows && group <= kDecodeRows; }
static int64_t region_keys_per_part() { return kKeysPerPart; }

static void region_norm(const float* x, const float* w, float eps, int64_t t, int64_t h, float* out) {
  for (int64_t r = 0; r < t; ++r) norm_row(x + r * h, w, eps, h, out + r * h);
}

static void region_add_norm(const float* x, const float* res, const float* w, float eps, int64_t t, int64_t h,
                            float* out, float* res_out) {
  for (int64_t r = 0; r < t; ++r) add_norm_row(x + r * h, res + r * h, w, eps, h, out + r * h, res_out + r * h);
}

static void region_silu(const float* x, int64_t t, int64_t n, float* out) {
  for (int64_t r = 0; r < t; ++r) silu_row(x + r * 2 * n, x + r * 2 * n + n, n, out + r * n);
}

static void region_qkv_rows(const QkvToCacheArgs& a, int64_t r0, int64_t r1) {
  alignas(64) float kbuf[kMaxHeadDim];
  for (int64_t r = r0; r < r1; ++r) qkv_row_to_cache(a, r, kbuf);
}

static void region_qkv_heads(const QkvToCacheArgs& a, int64_t r, int64_t g0, int64_t g1) {
  alignas(64) float kbuf[kMaxHeadDim];
  qkv_heads_to_cache(a, r, g0, g1, kbuf);
}

// The rows of a decode item, as paged_attention_impl's item_rows makes them for a one-query sequence.
static int64_t region_item_rows(const AttnArgs& a, const DecodeItem& w, AttnRow* rows) {
  const int64_t group = a.num_heads / a.num_kv_heads;
  for (int64_t r = 0; r < group; ++r) rows[r] = {a.query_start_loc[w.b], w.g * group + r, a.seq_lens[w.b]};
  return group;
}

template <int KV>
static int64_t region_attn_item_kv(const AttnArgs& a, const DecodeItem& w, float* parts, const DecodeItem* next,
                                int64_t warm) {
  AttnRow rows[kDecodeRows];
  const int64_t n = region_item_rows(a, w, rows);
  NextKeys nk{};
  if (next) nk = {a.block_tables + next->b * a.max_blocks, next->g, next->k0, std::min(a.seq_lens[next->b], next->k1)};
  return attend_rows<KV>(a, a.block_tables + w.b * a.max_blocks, w.g, rows, n, w.k0, w.k1,
                         w.part >= 0 ? parts + w.part : nullptr, next ? &nk : nullptr, warm);
}

static int64_t region_attn_item(const AttnArgs& a, const DecodeItem& w, float* parts, const DecodeItem* next,
                                int64_t warm) {
  switch (a.kv_kind) {
    case kKvS8: return region_attn_item_kv<kKvS8>(a, w, parts, next, warm);
    case kKvBF16: return region_attn_item_kv<kKvBF16>(a, w, parts, next, warm);
    default: return region_attn_item_kv<kKvF32>(a, w, parts, next, warm);
  }
}

static void region_attn_combine(const AttnArgs& a, const DecodeItem& first, int64_t nparts, const float* parts,
                                float* w) {
  AttnRow rows[kDecodeRows];
  const int64_t n = region_item_rows(a, first, rows);
  combine_parts(a, rows, n, nparts, parts + first.part, w);
}
