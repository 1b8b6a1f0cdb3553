// Paddle glue: validates shapes and dtypes, makes inputs contiguous, and calls the raw kernels in
// kernels.cc. Every op runs on CPU fp32 tensors (the KV cache ops also on bf16 caches); integer metadata
// may be int32 or int64.

#include <omp.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstring>
#include <vector>

#include "glue.h"
#include "kernels.h"
#include "output_blocks.h"
#include "paddle/extension.h"

namespace {

using paddle::Tensor;
using fdglue::as_i64;
using fdglue::check_f32;
using fdglue::contig;

int64_t last_dim(const Tensor& x) { return x.shape().empty() ? 1 : x.shape().back(); }

}  // namespace

// prompt_rows: uint8 [m] (1 = a prompt token's row, computed in bf16 on the bf16 levels) or empty.
std::vector<Tensor> Linear(const Tensor& x_in, const Tensor& w, const Tensor& scales, const Tensor& mins,
                           const Tensor& bias, const Tensor& prompt_rows, const Tensor& tiles, int64_t n,
                           int64_t kind, int64_t group, bool has_bias) {
  check_f32(x_in, "x");
  const Tensor x = contig(x_in);
  const int64_t k = last_dim(x);
  const int64_t m = k ? x.numel() / k : 0;
  std::vector<int64_t> shape = x.shape();
  PD_CHECK(!shape.empty() && k > 0, "linear: x must have at least one dimension and one feature");
  shape.back() = n;
  // An output this large (an LM head over many prompt rows) would be a fresh mapping on every call
  // (glibc maps anything over its mmap threshold by itself), every page faulted and cleared while the
  // kernel writes it: output_block reuses the last one freed.
  int64_t out_elems = 1;
  for (int64_t d : shape) out_elems *= d;
  Tensor out = out_elems * (int64_t)sizeof(float) >= fdk::kOutputBlockMinBytes
                   ? fdk::output_block(shape)
                   : paddle::empty(shape, paddle::DataType::FLOAT32, x.place());
  PD_CHECK(kind >= fdk::kF32 && kind <= fdk::kQ8_0, "linear: unknown weight kind ", kind);
  PD_CHECK(w.dtype() == fdglue::packed_dtype(kind) && w.is_contiguous(),
           "linear: packed weight has the wrong dtype for its kind");
  PD_CHECK(w.numel() == fdk::packed_elems((int)kind, n, k), "linear: x has ", k,
           " features but the packed weight does not match");
  if (m == 0) return {out};
  fdk::GemmArgs g{x.data<float>(), k, m, k, n, w.data(), scales.data<float>(), mins.data<float>(),
                  group, (int)kind, has_bias ? bias.data<float>() : nullptr, out.data<float>()};
  const uint8_t* rows = nullptr;
  if (prompt_rows.numel() > 0) {
    PD_CHECK(prompt_rows.dtype() == paddle::DataType::UINT8 && prompt_rows.is_contiguous(),
             "linear: prompt_rows must be a contiguous uint8 tensor");
    PD_CHECK(prompt_rows.numel() == m, "linear: prompt_rows has ", prompt_rows.numel(), " rows, x has ", m);
    rows = prompt_rows.data<uint8_t>();
  }
  g.tiles = fdglue::tiles_ptr(tiles, kind, n, k, "linear");
  fdk::gemm(g, rows);
  return {out};
}

// A quantized linear's bf16 tiles for the bf16 prompt rows (amx::pack_tiles), made once at load.
std::vector<Tensor> AmxTiles(const Tensor& w, const Tensor& scales, const Tensor& mins, int64_t n, int64_t k,
                             int64_t kind, int64_t group) {
  PD_CHECK(fdk::active_isa() >= fdk::kIsaAvx512Bf16, "amx_tiles: this process computes no prompt rows in bf16");
  PD_CHECK(kind > fdk::kF32 && kind <= fdk::kQ8_0, "amx_tiles: only quantized weights have tiles");
  PD_CHECK(w.dtype() == fdglue::packed_dtype(kind) && w.is_contiguous() && w.numel() == fdk::packed_elems((int)kind, n, k),
           "amx_tiles: packed weight does not match n and k");
  Tensor out = paddle::empty({fdk::amx::tiles_elems(n, k)}, paddle::DataType::INT16, w.place());
  fdk::GemmArgs g{nullptr, k, 0, k, n, w.data(), scales.data<float>(), mins.data<float>(), group, (int)kind,
                  nullptr, nullptr};
  fdk::amx::pack_tiles(g, reinterpret_cast<uint16_t*>(out.data<int16_t>()));
  return {out};
}

std::vector<Tensor> RmsNorm(const Tensor& x_in, const Tensor& w, float eps) {
  check_f32(x_in, "x");
  check_f32(w, "weight");
  const Tensor x = contig(x_in);
  const int64_t h = last_dim(x);
  PD_CHECK(w.numel() == h, "rms_norm: weight has ", w.numel(), " elements, x has ", h, " features");
  Tensor out = paddle::empty(x.shape(), paddle::DataType::FLOAT32, x.place());
  fdk::rms_norm(x.data<float>(), contig(w).data<float>(), eps, h ? x.numel() / h : 0, h, out.data<float>());
  return {out};
}

std::vector<Tensor> FusedAddRmsNorm(const Tensor& x_in, const Tensor& r_in, const Tensor& w, float eps) {
  check_f32(x_in, "x");
  check_f32(r_in, "residual");
  check_f32(w, "weight");
  const Tensor x = contig(x_in), r = contig(r_in);
  PD_CHECK(x.shape() == r.shape(), "fused_add_rms_norm: x and residual shapes differ");
  const int64_t h = last_dim(x);
  PD_CHECK(w.numel() == h, "fused_add_rms_norm: weight has ", w.numel(), " elements, x has ", h);
  Tensor out = paddle::empty(x.shape(), paddle::DataType::FLOAT32, x.place());
  Tensor res = paddle::empty(x.shape(), paddle::DataType::FLOAT32, x.place());
  fdk::fused_add_rms_norm(x.data<float>(), r.data<float>(), contig(w).data<float>(), eps, h ? x.numel() / h : 0,
                          h, out.data<float>(), res.data<float>());
  return {out, res};
}

std::vector<Tensor> SiluAndMul(const Tensor& x_in) {
  check_f32(x_in, "x");
  const Tensor x = contig(x_in);
  const int64_t h2 = last_dim(x);
  PD_CHECK(h2 % 2 == 0, "silu_and_mul: last dimension must be even, got ", h2);
  std::vector<int64_t> shape = x.shape();
  shape.back() = h2 / 2;
  Tensor out = paddle::empty(shape, paddle::DataType::FLOAT32, x.place());
  fdk::silu_and_mul(x.data<float>(), h2 ? x.numel() / h2 : 0, h2 / 2, out.data<float>());
  return {out};
}

// Floats between consecutive tokens of x, whose per-token part must be dense: contiguous tensors and
// column slices of a fused qkv projection both qualify. -1 if x has another layout.
int64_t row_stride(const Tensor& x) {
  const auto shape = x.shape();
  const auto st = x.strides();
  if (shape.empty()) return -1;
  int64_t dense = 1;
  for (int64_t d = (int64_t)shape.size() - 1; d >= 1; --d) {
    if (shape[d] != 1 && st[d] != dense) return -1;
    dense *= shape[d];
  }
  return shape.size() == 1 ? 1 : st[0];
}

// In place on q and k: a copy would not be seen by the caller, so views must be row-strided.
void Rotary(const Tensor& positions, Tensor& q, Tensor& k, const Tensor& cos_sin_in, int64_t head_dim) {
  check_f32(q, "q");
  check_f32(k, "k");
  check_f32(cos_sin_in, "cos_sin_cache");
  const int64_t qs = row_stride(q), ks = row_stride(k);
  PD_CHECK(qs >= 0 && ks >= 0, "rotary_embedding: q and k must be contiguous within each token");
  const Tensor cos_sin = contig(cos_sin_in);
  const std::vector<int64_t> pos = as_i64(positions, "positions");
  const int64_t t = (int64_t)pos.size();
  PD_CHECK(head_dim > 0 && head_dim % 2 == 0, "rotary_embedding: head_dim must be even");
  PD_CHECK(last_dim(cos_sin) == head_dim, "rotary_embedding: cos_sin_cache rows must have head_dim values");
  if (t == 0) return;
  PD_CHECK(q.shape()[0] == t && k.shape()[0] == t, "rotary_embedding: q/k and positions disagree on T");
  const int64_t q_row = q.numel() / t, k_row = k.numel() / t;
  PD_CHECK(q_row % head_dim == 0 && k_row % head_dim == 0, "rotary_embedding: rows are not whole heads");
  const int64_t max_pos = cos_sin.numel() / head_dim;
  for (int64_t p : pos) PD_CHECK(p >= 0 && p < max_pos, "rotary_embedding: position ", p, " out of range");
  fdk::rotary_embedding(pos.data(), q.data<float>(), k.data<float>(), cos_sin.data<float>(), t,
                        q_row / head_dim, k_row / head_dim, head_dim, qs, ks);
}

// Caches fp32, or bf16 (each value rounded to nearest even, bf16_impl.h).
void ReshapeAndCache(const Tensor& k_in, const Tensor& v_in, Tensor& kc, Tensor& vc, const Tensor& slots_in) {
  check_f32(k_in, "k");
  check_f32(v_in, "v");
  const int kind = fdglue::kv_cache_kind(kc, vc);
  PD_CHECK(kc.is_contiguous() && vc.is_contiguous(), "reshape_and_cache: caches must be contiguous");
  PD_CHECK(kc.shape().size() == 4 && kc.shape() == vc.shape(), "reshape_and_cache: caches must be [nb,nkv,bs,hd]");
  const Tensor k = contig(k_in), v = contig(v_in);
  const std::vector<int64_t> slots = as_i64(slots_in, "slot_mapping");
  const auto cs = kc.shape();
  const int64_t t = (int64_t)slots.size(), nkv = cs[1], bs = cs[2], hd = cs[3];
  PD_CHECK(k.numel() == t * nkv * hd && v.numel() == t * nkv * hd, "reshape_and_cache: k/v shape mismatch");
  for (int64_t s : slots) PD_CHECK(s < cs[0] * bs, "reshape_and_cache: slot ", s, " beyond the cache");
  if (kind == fdk::kKvBF16) {
    fdk::reshape_and_cache_bf16(k.data<float>(), v.data<float>(), static_cast<uint16_t*>(kc.data()),
                                static_cast<uint16_t*>(vc.data()), slots.data(), t, nkv, bs, hd);
  } else {
    fdk::reshape_and_cache(k.data<float>(), v.data<float>(), kc.data<float>(), vc.data<float>(), slots.data(), t,
                           nkv, bs, hd);
  }
}

std::vector<Tensor> PagedAttention(const Tensor& q_in, const Tensor& kc_in, const Tensor& vc_in,
                                   const Tensor& qsl_in, const Tensor& seq_lens_in, const Tensor& bt_in,
                                   const Tensor& prompt_rows, float scale) {
  check_f32(q_in, "q");
  const int kind = fdglue::kv_cache_kind(kc_in, vc_in);
  const Tensor q = contig(q_in), kc = contig(kc_in), vc = contig(vc_in);
  PD_CHECK(kc.shape().size() == 4 && kc.shape() == vc.shape(), "paged_attention: caches must be [nb,nkv,bs,hd]");
  const fdglue::PagedMeta m = fdglue::paged_meta(q, kc.shape(), qsl_in, seq_lens_in, bt_in);
  Tensor out = paddle::empty(q.shape(), paddle::DataType::FLOAT32, q.place());
  fdk::AttnArgs a{q.data<float>(), kc.data(), vc.data(), m.qsl.data(), m.lens.data(), m.bt.data(),
                  m.nseq, m.max_blocks, m.nh, m.nkv, m.bs, m.hd, scale, out.data<float>()};
  a.kv_kind = kind;
  a.prompt_rows = fdglue::prompt_rows_of(prompt_rows, q.shape()[0], "paged_attention");
  fdk::paged_attention(a);
  return {out};
}

// The rows `ids` (out features) of a packed GGUF block weight [n, k], as fp32 [ids..., k].
std::vector<Tensor> LinearRows(const Tensor& ids_in, const Tensor& w, int64_t n, int64_t k, int64_t kind) {
  PD_CHECK(fdk::is_qkind((int)kind), "linear_rows: only GGUF block weights (Q4_0, Q4_1, Q8_0)");
  PD_CHECK(w.dtype() == paddle::DataType::UINT8 && w.is_contiguous() && w.numel() == fdk::packed_elems((int)kind, n, k),
           "linear_rows: packed weight does not match n and k");
  const std::vector<int64_t> ids = as_i64(ids_in, "ids");
  for (int64_t v : ids) PD_CHECK(v >= 0 && v < n, "token id ", v, " is outside the vocabulary [0, ", n, ")");
  std::vector<int64_t> shape = ids_in.shape();
  shape.push_back(k);
  Tensor out = paddle::empty(shape, paddle::DataType::FLOAT32, w.place());
  fdk::q_rows(w.data(), (int)kind, k, ids.data(), (int64_t)ids.size(), out.data<float>());
  return {out};
}

std::vector<Tensor> ActiveIsa(const Tensor& x) {
  Tensor out = paddle::empty({1}, paddle::DataType::INT32, x.place());
  out.data<int32_t>()[0] = fdk::active_isa();
  return {out};
}

std::vector<Tensor> PromptTileMinRows(const Tensor& x) {
  Tensor out = paddle::empty({1}, paddle::DataType::INT64, x.place());
  out.data<int64_t>()[0] = fdk::prompt_tile_min_rows();
  return {out};
}

// 2^x elementwise by the prompt softmax's exp (vexp.h vexp2_nonpos), for its tests.
std::vector<Tensor> Exp2NonPos(const Tensor& x_in) {
  check_f32(x_in, "x");
  const Tensor x = contig(x_in);
  Tensor out = paddle::empty(x.shape(), paddle::DataType::FLOAT32, x.place());
  fdk::exp2_nonpos(x.data<float>(), x.numel(), out.data<float>());
  return {out};
}

// The OS thread id of each thread of the OpenMP team (index = omp_get_thread_num(); 0 is the caller). The
// runtime keeps this team for every later region of the same size, so pinning these threads pins the ones
// the kernels run on (fdcli_engine/threads.py).
std::vector<Tensor> OmpThreadIds(const Tensor& x) {
  const int n = omp_get_max_threads();
  Tensor out = paddle::empty({n}, paddle::DataType::INT64, x.place());
  int64_t* tids = out.data<int64_t>();
  for (int i = 0; i < n; ++i) tids[i] = -1;
#pragma omp parallel num_threads(n)
  tids[omp_get_thread_num()] = (int64_t)syscall(SYS_gettid);
  return {out};
}

PD_BUILD_OP(fd_linear)
    .Inputs({"X", "W", "Scales", "Mins", "Bias", "PromptRows", "Tiles"})
    .Outputs({"Out"})
    .Attrs({"n: int64_t", "kind: int64_t", "group: int64_t", "has_bias: bool"})
    .SetKernelFn(PD_KERNEL(Linear));

PD_BUILD_OP(fd_amx_tiles)
    .Inputs({"W", "Scales", "Mins"})
    .Outputs({"Tiles"})
    .Attrs({"n: int64_t", "k: int64_t", "kind: int64_t", "group: int64_t"})
    .SetKernelFn(PD_KERNEL(AmxTiles));

PD_BUILD_OP(fd_rms_norm)
    .Inputs({"X", "W"})
    .Outputs({"Out"})
    .Attrs({"eps: float"})
    .SetKernelFn(PD_KERNEL(RmsNorm));

PD_BUILD_OP(fd_fused_add_rms_norm)
    .Inputs({"X", "Residual", "W"})
    .Outputs({"Out", "ResidualOut"})
    .Attrs({"eps: float"})
    .SetKernelFn(PD_KERNEL(FusedAddRmsNorm));

PD_BUILD_OP(fd_silu_and_mul).Inputs({"X"}).Outputs({"Out"}).SetKernelFn(PD_KERNEL(SiluAndMul));

PD_BUILD_OP(fd_rotary_embedding)
    .Inputs({"Positions", "Q", "K", "CosSin"})
    .Outputs({"QOut", "KOut"})
    .Attrs({"head_dim: int64_t"})
    .SetInplaceMap({{"Q", "QOut"}, {"K", "KOut"}})
    .SetKernelFn(PD_KERNEL(Rotary));

PD_BUILD_OP(fd_reshape_and_cache)
    .Inputs({"K", "V", "KCache", "VCache", "Slots"})
    .Outputs({"KCacheOut", "VCacheOut"})
    .SetInplaceMap({{"KCache", "KCacheOut"}, {"VCache", "VCacheOut"}})
    .SetKernelFn(PD_KERNEL(ReshapeAndCache));

PD_BUILD_OP(fd_paged_attention)
    .Inputs({"Q", "KCache", "VCache", "QueryStartLoc", "SeqLens", "BlockTables", "PromptRows"})
    .Outputs({"Out"})
    .Attrs({"scale: float"})
    .SetKernelFn(PD_KERNEL(PagedAttention));

PD_BUILD_OP(fd_linear_rows)
    .Inputs({"Ids", "W"})
    .Outputs({"Out"})
    .Attrs({"n: int64_t", "k: int64_t", "kind: int64_t"})
    .SetKernelFn(PD_KERNEL(LinearRows));

PD_BUILD_OP(fd_active_isa).Inputs({"X"}).Outputs({"Out"}).SetKernelFn(PD_KERNEL(ActiveIsa));

PD_BUILD_OP(fd_prompt_tile_min_rows).Inputs({"X"}).Outputs({"Out"}).SetKernelFn(PD_KERNEL(PromptTileMinRows));

PD_BUILD_OP(fd_exp2_nonpos).Inputs({"X"}).Outputs({"Out"}).SetKernelFn(PD_KERNEL(Exp2NonPos));

PD_BUILD_OP(fd_omp_thread_ids).Inputs({"X"}).Outputs({"Out"}).SetKernelFn(PD_KERNEL(OmpThreadIds));
