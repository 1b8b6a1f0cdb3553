// Paddle glue of the C8 KV cache (--kv-cache-dtype int8, see c8_impl.h): int8 caches with fp32 per-row
// scales [nb, nkv, bs]. Separate ops rather than optional inputs on the fp32 ones, so the fp32 calls
// stay exactly as they were. Metadata checks are ops.cc's (glue.h).

#include <cstring>
#include <vector>

#include "glue.h"
#include "kernels.h"
#include "paddle/extension.h"

namespace {

using paddle::Tensor;

using fdglue::as_i64;
using fdglue::check_dtype;
using fdglue::contig;

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
                                     const Tensor& bt_in, const Tensor& prompt_rows, float scale) {
  check_dtype(q_in, paddle::DataType::FLOAT32, "q", "float32");
  check_c8_cache(kc, vc, ks, vs, "paged_attention");
  const Tensor q = contig(q_in);
  const fdglue::PagedMeta m = fdglue::paged_meta(q, kc.shape(), qsl_in, seq_lens_in, bt_in);
  Tensor out = paddle::empty(q.shape(), paddle::DataType::FLOAT32, q.place());
  fdk::AttnArgs a{q.data<float>(), kc.data<int8_t>(), vc.data<int8_t>(), m.qsl.data(), m.lens.data(), m.bt.data(),
                  m.nseq, m.max_blocks, m.nh, m.nkv, m.bs, m.hd, scale, out.data<float>(), ks.data<float>(),
                  vs.data<float>(), fdk::kKvS8};
  a.prompt_rows = fdglue::prompt_rows_of(prompt_rows, q.shape()[0], "paged_attention");
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
    .Inputs({"Q", "KCache", "VCache", "KScales", "VScales", "QueryStartLoc", "SeqLens", "BlockTables", "PromptRows"})
    .Outputs({"Out"})
    .Attrs({"scale: float"})
    .SetKernelFn(PD_KERNEL(PagedAttentionS8));
