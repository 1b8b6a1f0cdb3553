// Paddle glue of the C8 KV cache (--kv-cache-dtype int8, see c8_impl.h): int8 caches with fp32 per-row
// scales [nb, nkv, bs]. Separate ops rather than optional inputs on the fp32 ones, so the fp32 calls
// stay exactly as they were. Metadata checks mirror ops.cc's PagedAttention.

#include <cstring>
#include <vector>

#include "kernels.h"
#include "paddle/extension.h"

namespace {

using paddle::Tensor;

Tensor contig(const Tensor& x) { return x.is_contiguous() ? x : x.contiguous(); }

void check_dtype(const Tensor& x, paddle::DataType dt, const char* name, const char* what) {
  PD_CHECK(x.is_cpu(), name, " must be a CPU tensor");
  PD_CHECK(x.dtype() == dt, name, " must be ", what);
}

std::vector<int64_t> as_i64(const Tensor& x, const char* name) {
  PD_CHECK(x.is_cpu(), name, " must be a CPU tensor");
  const Tensor c = contig(x);
  std::vector<int64_t> out(c.numel());
  if (c.dtype() == paddle::DataType::INT64) {
    std::memcpy(out.data(), c.data<int64_t>(), out.size() * sizeof(int64_t));
  } else {
    PD_CHECK(c.dtype() == paddle::DataType::INT32, name, " must be int32 or int64");
    const int32_t* p = c.data<int32_t>();
    for (size_t i = 0; i < out.size(); ++i) out[i] = p[i];
  }
  return out;
}

// int8 caches [nb, nkv, bs, hd] and fp32 scales [nb, nkv, bs], all contiguous and agreeing.
void check_c8_cache(const Tensor& kc, const Tensor& vc, const Tensor& ks, const Tensor& vs, const char* op) {
  const auto I8 = paddle::DataType::INT8, F32 = paddle::DataType::FLOAT32;
  check_dtype(kc, I8, "k_cache", "int8 (C8 cache)");
  check_dtype(vc, I8, "v_cache", "int8 (C8 cache)");
  check_dtype(ks, F32, "k_scales", "float32");
  check_dtype(vs, F32, "v_scales", "float32");
  PD_CHECK(kc.is_contiguous() && vc.is_contiguous() && ks.is_contiguous() && vs.is_contiguous(), op,
           ": caches and scales must be contiguous");
  const auto cs = kc.shape();
  PD_CHECK(cs.size() == 4 && vc.shape() == cs, op, ": caches must be [nb,nkv,bs,hd]");
  const std::vector<int64_t> ss(cs.begin(), cs.end() - 1);
  PD_CHECK(ks.shape() == ss && vs.shape() == ss, op, ": scales must be [nb,nkv,bs] like the caches");
}

}  // namespace

void ReshapeAndCacheS8(const Tensor& k_in, const Tensor& v_in, Tensor& kc, Tensor& vc, Tensor& ks, Tensor& vs,
                       const Tensor& slots_in) {
  check_dtype(k_in, paddle::DataType::FLOAT32, "k", "float32");
  check_dtype(v_in, paddle::DataType::FLOAT32, "v", "float32");
  check_c8_cache(kc, vc, ks, vs, "reshape_and_cache");
  const Tensor k = contig(k_in), v = contig(v_in);
  const std::vector<int64_t> slots = as_i64(slots_in, "slot_mapping");
  const auto cs = kc.shape();
  const int64_t t = (int64_t)slots.size(), nkv = cs[1], bs = cs[2], hd = cs[3];
  PD_CHECK(k.numel() == t * nkv * hd && v.numel() == t * nkv * hd, "reshape_and_cache: k/v shape mismatch");
  for (int64_t s : slots) PD_CHECK(s < cs[0] * bs, "reshape_and_cache: slot ", s, " beyond the cache");
  fdk::reshape_and_cache_s8(k.data<float>(), v.data<float>(), kc.data<int8_t>(), vc.data<int8_t>(),
                            ks.data<float>(), vs.data<float>(), slots.data(), t, nkv, bs, hd);
}

std::vector<Tensor> PagedAttentionS8(const Tensor& q_in, const Tensor& kc, const Tensor& vc, const Tensor& ks,
                                     const Tensor& vs, const Tensor& qsl_in, const Tensor& seq_lens_in,
                                     const Tensor& bt_in, float scale) {
  check_dtype(q_in, paddle::DataType::FLOAT32, "q", "float32");
  check_c8_cache(kc, vc, ks, vs, "paged_attention");
  const Tensor q = contig(q_in);
  PD_CHECK(q.shape().size() == 3, "paged_attention: q must be [T, nh, hd]");
  const auto qs = q.shape(), cs = kc.shape();
  const int64_t nh = qs[1], hd = qs[2], nkv = cs[1], bs = cs[2];
  PD_CHECK(cs[3] == hd && hd <= 512, "paged_attention: head_dim mismatch (or > 512)");
  PD_CHECK(nkv > 0 && nh % nkv == 0, "paged_attention: num_heads must be a multiple of num_kv_heads");
  const std::vector<int64_t> qsl = as_i64(qsl_in, "query_start_loc"), lens = as_i64(seq_lens_in, "seq_lens"),
                             bt = as_i64(bt_in, "block_tables");
  const int64_t nseq = (int64_t)lens.size();
  PD_CHECK((int64_t)qsl.size() == nseq + 1 && qsl[nseq] == qs[0], "paged_attention: query_start_loc mismatch");
  const int64_t max_blocks = nseq ? (int64_t)bt.size() / nseq : 0;
  for (int64_t b = 0; b < nseq; ++b) {
    const int64_t nq = qsl[b + 1] - qsl[b];
    PD_CHECK(nq >= 0 && nq <= lens[b], "paged_attention: sequence ", b, " has more queries than context");
    PD_CHECK(lens[b] <= max_blocks * bs, "paged_attention: block table too short for sequence ", b);
    for (int64_t j = 0; j < (lens[b] + bs - 1) / bs; ++j)
      PD_CHECK(bt[b * max_blocks + j] >= 0 && bt[b * max_blocks + j] < cs[0], "paged_attention: bad block id");
  }
  Tensor out = paddle::empty(qs, paddle::DataType::FLOAT32, q.place());
  fdk::AttnArgs a{q.data<float>(), kc.data<int8_t>(), vc.data<int8_t>(), qsl.data(), lens.data(), bt.data(),
                  nseq, max_blocks, nh, nkv, bs, hd, scale, out.data<float>(), ks.data<float>(), vs.data<float>()};
  fdk::paged_attention(a);
  return {out};
}

PD_BUILD_OP(fd_reshape_and_cache_s8)
    .Inputs({"K", "V", "KCache", "VCache", "KScales", "VScales", "Slots"})
    .Outputs({"KCacheOut", "VCacheOut", "KScalesOut", "VScalesOut"})
    .SetInplaceMap({{"KCache", "KCacheOut"}, {"VCache", "VCacheOut"}, {"KScales", "KScalesOut"},
                    {"VScales", "VScalesOut"}})
    .SetKernelFn(PD_KERNEL(ReshapeAndCacheS8));

PD_BUILD_OP(fd_paged_attention_s8)
    .Inputs({"Q", "KCache", "VCache", "KScales", "VScales", "QueryStartLoc", "SeqLens", "BlockTables"})
    .Outputs({"Out"})
    .Attrs({"scale: float"})
    .SetKernelFn(PD_KERNEL(PagedAttentionS8));
