// Paddle glue of the encoder kernels (encoder_kernels.h): shape/dtype checks, then the raw kernels.
// CPU fp32 tensors; cu_seqlens may be int32 or int64. Helpers are file-local (ops.cc has its own).

#include <algorithm>
#include <cstring>
#include <vector>

#include "encoder_kernels.h"
#include "paddle/extension.h"

namespace {

using paddle::Tensor;

Tensor dense(const Tensor& x) { return x.is_contiguous() ? x : x.contiguous(); }

void need_f32(const Tensor& x, const char* op, const char* name) {
  PD_CHECK(x.is_cpu(), op, ": ", name, " must be a CPU tensor");
  PD_CHECK(x.dtype() == paddle::DataType::FLOAT32, op, ": ", name, " must be float32");
}

std::vector<int64_t> offsets_i64(const Tensor& x) {
  PD_CHECK(x.is_cpu(), "varlen_attention: cu_seqlens must be a CPU tensor");
  const Tensor c = dense(x);
  std::vector<int64_t> out(c.numel());
  if (c.dtype() == paddle::DataType::INT64) {
    std::memcpy(out.data(), c.data<int64_t>(), out.size() * sizeof(int64_t));
  } else {
    PD_CHECK(c.dtype() == paddle::DataType::INT32, "varlen_attention: cu_seqlens must be int32 or int64");
    const int32_t* p = c.data<int32_t>();
    for (size_t i = 0; i < out.size(); ++i) out[i] = p[i];
  }
  return out;
}

// x as [T, nh, hd] rows of dense heads, and the floats between consecutive tokens. Column slices of a
// fused qkv projection keep their stride; any other layout is copied first.
Tensor token_rows(const Tensor& x, int64_t* stride) {
  const auto sh = x.shape();
  const auto st = x.strides();
  if (sh.size() == 3 && (sh[2] == 1 || st[2] == 1) && (sh[1] == 1 || st[1] == sh[2])) {
    *stride = st[0];
    return x;
  }
  Tensor c = dense(x);
  *stride = sh.size() == 3 ? sh[1] * sh[2] : 0;
  return c;
}

int64_t last_dim(const Tensor& x) { return x.shape().empty() ? 1 : x.shape().back(); }

}  // namespace

std::vector<Tensor> VarlenAttention(const Tensor& q_in, const Tensor& k_in, const Tensor& v_in,
                                    const Tensor& cu_in, float scale) {
  need_f32(q_in, "varlen_attention", "q");
  need_f32(k_in, "varlen_attention", "k");
  need_f32(v_in, "varlen_attention", "v");
  PD_CHECK(q_in.shape().size() == 3, "varlen_attention: q must be [T, num_heads, head_dim]");
  PD_CHECK(k_in.shape() == q_in.shape() && v_in.shape() == q_in.shape(),
           "varlen_attention: q, k and v shapes differ");
  int64_t qs = 0, ks = 0, vs = 0;
  const Tensor q = token_rows(q_in, &qs), k = token_rows(k_in, &ks), v = token_rows(v_in, &vs);
  const auto shape = q.shape();
  const int64_t t = shape[0], nh = shape[1], hd = shape[2];
  PD_CHECK(hd > 0 && hd <= 512, "varlen_attention: head_dim must be 1..512, got ", hd);
  const std::vector<int64_t> cu = offsets_i64(cu_in);
  PD_CHECK(!cu.empty() && cu[0] == 0 && cu.back() == t,
           "varlen_attention: cu_seqlens must start at 0 and end at the token count ", t);
  int64_t max_len = 0;
  for (size_t b = 0; b + 1 < cu.size(); ++b) {
    PD_CHECK(cu[b + 1] >= cu[b], "varlen_attention: cu_seqlens must be non-decreasing");
    max_len = std::max(max_len, cu[b + 1] - cu[b]);
  }
  Tensor out = paddle::empty(shape, paddle::DataType::FLOAT32, q.place());
  if (t == 0 || nh == 0) return {out};
  fdk::VarlenAttnArgs a{q.data<float>(), k.data<float>(), v.data<float>(), qs, ks, vs, cu.data(),
                        (int64_t)cu.size() - 1, nh, hd, max_len, scale, out.data<float>()};
  fdk::varlen_attention(a);
  return {out};
}

std::vector<Tensor> Gelu(const Tensor& x_in) {
  need_f32(x_in, "gelu", "x");
  const Tensor x = dense(x_in);
  Tensor out = paddle::empty(x.shape(), paddle::DataType::FLOAT32, x.place());
  fdk::gelu(x.data<float>(), x.numel(), out.data<float>());
  return {out};
}

std::vector<Tensor> AddLayerNorm(const Tensor& x_in, const Tensor& r_in, const Tensor& w_in, const Tensor& b_in,
                                 float eps) {
  need_f32(x_in, "add_layer_norm", "x");
  need_f32(r_in, "add_layer_norm", "residual");
  need_f32(w_in, "add_layer_norm", "weight");
  need_f32(b_in, "add_layer_norm", "bias");
  const Tensor x = dense(x_in), r = dense(r_in), w = dense(w_in), b = dense(b_in);
  PD_CHECK(x.shape() == r.shape(), "add_layer_norm: x and residual shapes differ");
  const int64_t h = last_dim(x);
  PD_CHECK(h > 0 && w.numel() == h && b.numel() == h, "add_layer_norm: weight and bias must have ", h,
           " elements (x's last dimension)");
  Tensor out = paddle::empty(x.shape(), paddle::DataType::FLOAT32, x.place());
  fdk::add_layer_norm(x.data<float>(), r.data<float>(), w.data<float>(), b.data<float>(), eps, x.numel() / h, h,
                      out.data<float>());
  return {out};
}

PD_BUILD_OP(fd_varlen_attention)
    .Inputs({"Q", "K", "V", "CuSeqlens"})
    .Outputs({"Out"})
    .Attrs({"scale: float"})
    .SetKernelFn(PD_KERNEL(VarlenAttention));

PD_BUILD_OP(fd_gelu).Inputs({"X"}).Outputs({"Out"}).SetKernelFn(PD_KERNEL(Gelu));

PD_BUILD_OP(fd_add_layer_norm)
    .Inputs({"X", "Residual", "W", "B"})
    .Outputs({"Out"})
    .Attrs({"eps: float"})
    .SetKernelFn(PD_KERNEL(AddLayerNorm));
