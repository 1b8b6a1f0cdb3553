// Raw-pointer interface of the encoder (BERT) kernels: bidirectional varlen attention, GELU, add +
// LayerNorm. Instantiated per ISA in encoder_kernels.cc (dispatch as in kernels.cc), called by the Paddle
// glue in encoder_ops.cc. Nothing here knows about Paddle.
#pragma once
#include <cstdint>

namespace fdk {

struct VarlenAttnArgs {
  // Token t, head h of q starts at q + t * q_stride + h * head_dim (likewise k, v): the rows may be
  // column slices of one fused qkv projection. Heads of one token are contiguous.
  const float* q;
  const float* k;
  const float* v;
  int64_t q_stride, k_stride, v_stride;
  const int64_t* cu_seqlens;  // [B + 1]: sequence b owns tokens cu_seqlens[b] .. cu_seqlens[b+1]
  int64_t num_seqs, num_heads, head_dim, max_seqlen;
  float scale;
  float* out;  // [T, nh, hd] contiguous
};

// Full (non-causal) attention of every token to every token of its own sequence.
void varlen_attention(const VarlenAttnArgs& a);
// out = x * Phi(x) = 0.5 x (1 + erf(x / sqrt 2)) elementwise (BERT's "gelu").
void gelu(const float* x, int64_t n, float* out);
// out = LayerNorm(x + res) * w + b over rows of h (BERT's post-norm residual).
void add_layer_norm(const float* x, const float* res, const float* w, const float* b, float eps, int64_t t,
                    int64_t h, float* out);

}  // namespace fdk
