// Paged attention over the block-table KV cache, included by kern_impl.h inside an ISA namespace.
// Varlen batch: sequence b owns query tokens query_start_loc[b] .. query_start_loc[b+1]; query i sits at
// position seq_len - q_len + i and attends causally to keys 0..position through its block table.
// No include guard on purpose.

constexpr int64_t kKeyChunk = 64;     // scores buffered per online-softmax update
constexpr int64_t kQueryChunk = 16;   // queries of one head per work item
constexpr int64_t kMaxHeadDim = 512;  // checked by the glue

// One query row against its causal context: online softmax, rescaling the running sum and output only
// once per chunk of keys (at most one block).
static void attend_one(const AttnArgs& a, const int64_t* bt, int64_t g, int64_t nk, const float* qp,
                       float* op) {
  const int64_t hd = a.head_dim, bs = a.block_size;
  float acc[kMaxHeadDim];
  float sc[kKeyChunk];
  for (int64_t d = 0; d < hd; ++d) acc[d] = 0.0f;
  float mx = -INFINITY, l = 0.0f;
  for (int64_t kk = 0; kk < nk;) {
    const int64_t off = kk % bs;
    const int64_t n = std::min(std::min(bs - off, nk - kk), kKeyChunk);
    const int64_t base = ((bt[kk / bs] * a.num_kv_heads + g) * bs + off) * hd;
    const float* kp = a.k_cache + base;
    const float* vp = a.v_cache + base;
    float cmax = -INFINITY;
    for (int64_t j = 0; j < n; ++j) {
      sc[j] = dot(qp, kp + j * hd, hd) * a.scale;
      cmax = std::max(cmax, sc[j]);
    }
    const float mnew = std::max(mx, cmax);
    const float corr = std::exp(mx - mnew);  // exp(-inf) = 0 on the first chunk
    int64_t j = 0;
    for (; j + FD_W <= n; j += FD_W) vstore(sc + j, vexp(vsub(vload(sc + j), vset1(mnew))));
    for (; j < n; ++j) sc[j] = std::exp(sc[j] - mnew);
    float psum = 0.0f;
    for (j = 0; j < n; ++j) psum += sc[j];
    l = l * corr + psum;
    int64_t d = 0;
    for (; d + FD_W <= hd; d += FD_W) {
      vf o = vmul(vload(acc + d), vset1(corr));
      for (j = 0; j < n; ++j) o = vfma(vset1(sc[j]), vload(vp + j * hd + d), o);
      vstore(acc + d, o);
    }
    for (; d < hd; ++d) {
      float o = acc[d] * corr;
      for (j = 0; j < n; ++j) o += sc[j] * vp[j * hd + d];
      acc[d] = o;
    }
    mx = mnew;
    kk += n;
  }
  const float inv = nk > 0 ? 1.0f / l : 0.0f;
  for (int64_t d = 0; d < hd; ++d) op[d] = acc[d] * inv;
}

static void paged_attention(const AttnArgs& a) {
  // Work items are (sequence, head, chunk of queries); dynamic scheduling evens out the causal
  // triangle, where late queries see more keys.
  struct Item {
    int64_t b, h, q0, q1;
  };
  std::vector<Item> items;
  for (int64_t b = 0; b < a.num_seqs; ++b) {
    const int64_t nq = a.query_start_loc[b + 1] - a.query_start_loc[b];
    for (int64_t h = 0; h < a.num_heads; ++h)
      for (int64_t q0 = 0; q0 < nq; q0 += kQueryChunk) items.push_back({b, h, q0, std::min(nq, q0 + kQueryChunk)});
  }
  const int64_t group = a.num_heads / a.num_kv_heads;
  const int64_t nitems = (int64_t)items.size();
#pragma omp parallel for schedule(dynamic, 1) if (nitems > 1)
  for (int64_t it = 0; it < nitems; ++it) {
    const Item& w = items[it];
    const int64_t qs = a.query_start_loc[w.b];
    const int64_t nq = a.query_start_loc[w.b + 1] - qs;
    const int64_t* bt = a.block_tables + w.b * a.max_blocks;
    for (int64_t i = w.q0; i < w.q1; ++i) {
      const int64_t t = qs + i;
      const int64_t nk = a.seq_lens[w.b] - nq + i + 1;
      const int64_t row = (t * a.num_heads + w.h) * a.head_dim;
      attend_one(a, bt, w.h / group, nk, a.q + row, a.out + row);
    }
  }
}
