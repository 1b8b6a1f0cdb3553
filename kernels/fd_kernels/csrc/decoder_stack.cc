// decoder_stack(): the per-op decoder forward (fdcli_engine/models/decoder.py) replayed in C++.
//
// Invariant: every value is computed by the same arithmetic, in the same order, as the Python path's op
// calls (shapes, eps, scale, prompt-row mask); only the buffers and the passes differ. The GEMMs and
// attention are the same kernel calls; the elementwise ops between them are fused where one pass over
// the rows can do several (qkv_rope_to_cache: split + q/k norms + rotary + cache write; gemm_silu_mul:
// silu(gate) * up inside down_proj's input conversion, or in place before it; the residual add + RMSNorm
// after o_proj and down_proj as their GEMM's row epilogue, kernels.h), each element still taking
// the single ops' formula. The kernels are deterministic functions of their arguments (their OpenMP
// splits depend on the shapes, never on the addresses), so the output and the KV caches are bit-identical
// to the per-op path. The buffers are [T, width] scratch arrays allocated once per call.

#include "decoder_stack.h"
#include "decode_region.h"
#include "scratch.h"

#include <cstdlib>
#include <cstring>
#include <memory>

namespace fdk {

namespace {

// The residual add + RMSNorm that follows o_proj and down_proj, as a GEMM epilogue over rows of its
// output: fused_add_rms_norm on those rows (in place on the residual), the same per-row arithmetic.
struct AddNorm {
  const float* x;  // the projection's output [t, h]
  float* residual;
  const float* w;
  float eps;
  int64_t h;
  float* out;
};

void add_norm_rows(void* ctx, int64_t r0, int64_t r1) {
  const AddNorm& n = *static_cast<const AddNorm*>(ctx);
  const int64_t o = r0 * n.h;
  fused_add_rms_norm(n.x + o, n.residual + o, n.w, n.eps, r1 - r0, n.h, n.out + o, n.residual + o);
}

// fd_linear: x [t, k] -> c [t, l.n], then `norm` (if any) on c's rows.
void linear(const StackLinear& l, const float* x, int64_t t, int64_t k, float* c, const uint8_t* prompt_rows,
            AddNorm* norm = nullptr) {
  GemmArgs g{x, k, t, k, l.n, l.w, l.scales, l.mins, l.group, l.kind, l.bias, c};
  g.tiles = l.tiles;
  g.epilogue = norm ? add_norm_rows : nullptr;
  g.epilogue_ctx = norm;
  gemm(g, prompt_rows);
}

}  // namespace

void decoder_stack(const StackArgs& a, const StackLayer* layers, const StackCache* caches, int64_t num_layers,
                   const float* x, float* out) {
  const int64_t t = a.num_tokens, h = a.hidden, hd = a.head_dim, inter = a.intermediate;
  const int64_t q_size = a.num_heads * hd, qkv_n = q_size + 2 * a.num_kv_heads * hd;
  if (num_layers == 0) return rms_norm(x, a.final_norm, a.eps, t, h, out);
  if (t == 0) return;
  // A pure-decode step (up to 64 rows): the same values from one parallel region (decode_region.h).
  if (decode_region_applies(a, layers, num_layers)) return decode_region_stack(a, layers, caches, num_layers, x, out);
  auto residual = scratch(t * h), hidden = scratch(t * h), normed = scratch(t * h);
  auto qkv = scratch(t * qkv_n), q = scratch(t * q_size);
  auto attn = scratch(t * q_size), gate_up = scratch(t * 2 * inter);
  const uint8_t* rows = a.prompt_rows;

  for (int64_t i = 0; i < num_layers; ++i) {
    const StackLayer& l = layers[i];
    const StackCache& c = caches[i];
    // The residual stream: layer 0 starts it from the embeddings, later layers add their input to it.
    // (Later layers' add + norm ran as the previous down_proj's epilogue.)
    if (i == 0) {
      std::memcpy(residual.get(), x, t * h * sizeof(float));
      rms_norm(x, l.input_norm, a.eps, t, h, normed.get());
    }

    // Attention (layers/attention.py).
    linear(l.qkv, normed.get(), t, h, qkv.get(), rows);
    // Split, q/k norms, rotary and the cache write as one pass over the fused rows (no dense K / V).
    QkvToCacheArgs qc{qkv.get(), t,         a.num_heads, a.num_kv_heads, hd,      a.positions,
                      a.cos_sin, l.q_norm,  l.k_norm,    a.eps,          q.get(), c.k_cache,
                      c.v_cache, c.k_scales, c.v_scales, c.kv_kind,      a.slot_mapping, a.block_size};
    qkv_rope_to_cache(qc);
    AttnArgs at{q.get(),    c.k_cache,    c.v_cache,   a.query_start_loc, a.seq_lens,   a.block_tables,
                a.num_seqs, a.max_blocks, a.num_heads, a.num_kv_heads,    a.block_size, hd,
                a.scale,    attn.get(),   c.k_scales,  c.v_scales,        c.kv_kind};
    at.prompt_rows = rows;
    paged_attention(at);
    // In place on the residual: the norm reads each residual value before it writes that slot.
    AddNorm post{hidden.get(), residual.get(), l.post_norm, a.eps, h, normed.get()};
    linear(l.o_proj, attn.get(), t, q_size, hidden.get(), rows, &post);

    // Gated MLP (layers/activation.py).
    linear(l.gate_up, normed.get(), t, h, gate_up.get(), rows);
    // down_proj of silu(gate) * up, read from the fused rows (2 * inter apart).
    GemmArgs down{nullptr, 2 * inter, t, inter, l.down.n, l.down.w, l.down.scales, l.down.mins,
                  l.down.group, l.down.kind, l.down.bias, hidden.get()};
    down.tiles = l.down.tiles;
    // Then the next layer's input add + norm, or after the last layer the final one into out.
    const bool last = i + 1 == num_layers;
    AddNorm next{hidden.get(), residual.get(), last ? a.final_norm : layers[i + 1].input_norm, a.eps, h,
                 last ? out : normed.get()};
    down.epilogue = add_norm_rows;
    down.epilogue_ctx = &next;
    gemm_silu_mul(down, gate_up.get(), rows);
  }
}

}  // namespace fdk
