// decoder_stack(): the per-op decoder forward (fdcli_engine/models/decoder.py) replayed in C++.
//
// Invariant: every kernel call below matches one op call of the Python path, in the same order and with
// the same arguments (shapes, strides, eps, scale, prompt-row mask); only the buffers differ. The
// kernels are deterministic functions of their arguments (their OpenMP splits depend on the shapes,
// never on the addresses), so the output and the KV caches are bit-identical to the per-op path.
// The buffers are dense [T, width] scratch arrays allocated once per call.

#include "decoder_stack.h"

#include <cstdlib>
#include <cstring>
#include <memory>

namespace fdk {

namespace {

struct FreeDeleter {
  void operator()(float* p) const { std::free(p); }
};

// Uninitialized, 64-byte aligned: a 512-token prefill needs ~18 MB of scratch, not worth zeroing.
std::unique_ptr<float[], FreeDeleter> scratch(int64_t floats) {
  const size_t bytes = ((size_t)(floats > 0 ? floats : 1) * sizeof(float) + 63) / 64 * 64;
  float* p = static_cast<float*>(std::aligned_alloc(64, bytes));
  if (!p) throw std::bad_alloc();
  return std::unique_ptr<float[], FreeDeleter>(p);
}

// fd_linear: x [t, k] -> c [t, l.n].
void linear(const StackLinear& l, const float* x, int64_t t, int64_t k, float* c, const uint8_t* prompt_rows) {
  GemmArgs g{x, k, t, k, l.n, l.w, l.scales, l.mins, l.group, l.kind, l.bias, c};
  g.tiles = l.tiles;
  gemm(g, prompt_rows);
}

// The fused qkv output [t, q_size + 2 * kv_size] split into dense q [t, q_size], k and v [t, kv_size]:
// the contiguous copies Paddle makes of its column slices (paddle.split, then .contiguous()). One pass
// over the rows, split over the threads for prefill-sized steps, where a serial copy (7.5 MB a layer at
// 2048 tokens) left the other thread waiting.
void split_qkv(const float* qkv, int64_t t, int64_t q_size, int64_t kv_size, float* q, float* k, float* v) {
  const int64_t width = q_size + 2 * kv_size;
#pragma omp parallel for schedule(static) if (t * width >= (1 << 16))
  for (int64_t r = 0; r < t; ++r) {
    const float* row = qkv + r * width;
    std::memcpy(q + r * q_size, row, q_size * sizeof(float));
    std::memcpy(k + r * kv_size, row + q_size, kv_size * sizeof(float));
    std::memcpy(v + r * kv_size, row + q_size + kv_size, kv_size * sizeof(float));
  }
}

}  // namespace

void decoder_stack(const StackArgs& a, const StackLayer* layers, const StackCache* caches, int64_t num_layers,
                   const float* x, float* out) {
  const int64_t t = a.num_tokens, h = a.hidden, hd = a.head_dim, inter = a.intermediate;
  const int64_t q_size = a.num_heads * hd, kv_size = a.num_kv_heads * hd, qkv_n = q_size + 2 * kv_size;
  if (num_layers == 0) return rms_norm(x, a.final_norm, a.eps, t, h, out);
  if (t == 0) return;
  auto residual = scratch(t * h), hidden = scratch(t * h), normed = scratch(t * h);
  auto qkv = scratch(t * qkv_n), q = scratch(t * q_size), k = scratch(t * kv_size), v = scratch(t * kv_size);
  auto attn = scratch(t * q_size), gate_up = scratch(t * 2 * inter), act = scratch(t * inter);
  const bool qk_norm = layers[0].q_norm != nullptr;
  auto q_normed = scratch(qk_norm ? t * q_size : 0), k_normed = scratch(qk_norm ? t * kv_size : 0);
  const uint8_t* rows = a.prompt_rows;

  for (int64_t i = 0; i < num_layers; ++i) {
    const StackLayer& l = layers[i];
    const StackCache& c = caches[i];
    // The residual stream: layer 0 starts it from the embeddings, later layers add their input to it.
    if (i == 0) {
      std::memcpy(residual.get(), x, t * h * sizeof(float));
      rms_norm(x, l.input_norm, a.eps, t, h, normed.get());
    } else {
      // In place on the residual: the kernel reads each residual value before it writes that slot.
      fused_add_rms_norm(hidden.get(), residual.get(), l.input_norm, a.eps, t, h, normed.get(), residual.get());
    }

    // Attention (layers/attention.py).
    linear(l.qkv, normed.get(), t, h, qkv.get(), rows);
    split_qkv(qkv.get(), t, q_size, kv_size, q.get(), k.get(), v.get());
    float *qp = q.get(), *kp = k.get();
    if (qk_norm) {  // over each head's head_dim values: rows of [T * heads, hd]
      rms_norm(qp, l.q_norm, a.eps, t * a.num_heads, hd, q_normed.get());
      rms_norm(kp, l.k_norm, a.eps, t * a.num_kv_heads, hd, k_normed.get());
      qp = q_normed.get();
      kp = k_normed.get();
    }
    rotary_embedding(a.positions, qp, kp, a.cos_sin, t, a.num_heads, a.num_kv_heads, hd, q_size, kv_size);
    if (c.kv_kind == kKvS8) {
      reshape_and_cache_s8(kp, v.get(), static_cast<int8_t*>(c.k_cache), static_cast<int8_t*>(c.v_cache),
                           c.k_scales, c.v_scales, a.slot_mapping, t, a.num_kv_heads, a.block_size, hd);
    } else if (c.kv_kind == kKvBF16) {
      reshape_and_cache_bf16(kp, v.get(), static_cast<uint16_t*>(c.k_cache), static_cast<uint16_t*>(c.v_cache),
                             a.slot_mapping, t, a.num_kv_heads, a.block_size, hd);
    } else {
      reshape_and_cache(kp, v.get(), static_cast<float*>(c.k_cache), static_cast<float*>(c.v_cache),
                        a.slot_mapping, t, a.num_kv_heads, a.block_size, hd);
    }
    AttnArgs at{qp,         c.k_cache,    c.v_cache,   a.query_start_loc, a.seq_lens,   a.block_tables,
                a.num_seqs, a.max_blocks, a.num_heads, a.num_kv_heads,    a.block_size, hd,
                a.scale,    attn.get(),   c.k_scales,  c.v_scales,     c.kv_kind};
    at.prompt_rows = rows;
    paged_attention(at);
    linear(l.o_proj, attn.get(), t, q_size, hidden.get(), rows);

    // Gated MLP (layers/activation.py).
    fused_add_rms_norm(hidden.get(), residual.get(), l.post_norm, a.eps, t, h, normed.get(), residual.get());
    linear(l.gate_up, normed.get(), t, h, gate_up.get(), rows);
    silu_and_mul(gate_up.get(), t, inter, act.get());
    linear(l.down, act.get(), t, inter, hidden.get(), rows);
  }
  fused_add_rms_norm(hidden.get(), residual.get(), a.final_norm, a.eps, t, h, out, residual.get());
}

}  // namespace fdk
