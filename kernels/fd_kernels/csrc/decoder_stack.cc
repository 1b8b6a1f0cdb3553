// decoder_stack(): the per-op decoder forward (fdcli_engine/models/decoder.py) replayed in C++.
//
// Invariant: every value is computed by the same arithmetic, in the same order, as the Python path's op
// calls (shapes, eps, scale, prompt-row mask); only the buffers and the passes differ. The GEMMs and
// attention are the same kernel calls; the elementwise ops between them are fused where one pass over
// the rows can do several (qkv_rope_to_cache: split + q/k norms + rotary + cache write; gemm_silu_mul:
// silu(gate) * up inside down_proj's input conversion, or in place before it; gemm_gate_up_silu_down:
// gate_up's bf16 tile products turned into down_proj's A tiles as silu(gate) * up; the residual add + RMSNorm
// after o_proj and down_proj as their GEMM's row epilogue, kernels.h), each element still taking
// the single ops' formula. The kernels are deterministic functions of their arguments (their OpenMP
// splits depend on the shapes, never on the addresses), so the output and the KV caches are bit-identical
// to the per-op path. The buffers are [T, width] scratch arrays allocated once per call.
//
// With StackArgs::out_* (the rows that are read), the last layer runs past its cache write on those rows
// alone, as the per-op path's last layer does with meta.out: the same calls on fewer rows.

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
  GemmArgs g = stack_gemm_args(l, x, t, k, c);
  g.epilogue = norm ? add_norm_rows : nullptr;
  g.epilogue_ctx = norm;
  gemm(g, prompt_rows);
}

// Rows of a layer after its cache write, and the attention metadata that describes them: the whole step,
// or in the last layer only the rows that are read (StackArgs::out_rows).
struct Rows {
  int64_t t;
  const int64_t *qsl, *seq_lens, *block_tables;
  int64_t num_seqs;
  const uint8_t* prompt_rows;
};

// Attention, o_proj, its add + norm, the gated MLP, then `next_norm`'s add + norm into `next_out`: the rest
// of a layer over `r`'s rows, from their queries q [r.t, q_size] and residual stream [r.t, hidden].
// Scratch: attn [r.t, q_size], hidden and normed [r.t, hidden], gate_up [r.t, 2 * inter].
void attend_and_mlp(const StackArgs& a, const StackLayer& l, const StackCache& c, const Rows& r, const float* q,
                    float* residual, float* attn, float* hidden, float* normed, float* gate_up,
                    const float* next_norm, float* next_out) {
  const int64_t t = r.t, h = a.hidden, inter = a.intermediate, q_size = a.num_heads * a.head_dim;
  AttnArgs at{q,          c.k_cache,    c.v_cache,   r.qsl,          r.seq_lens,   r.block_tables,
              r.num_seqs, a.max_blocks, a.num_heads, a.num_kv_heads, a.block_size, a.head_dim,
              a.scale,    attn,         c.k_scales,  c.v_scales,     c.kv_kind};
  at.prompt_rows = r.prompt_rows;
  paged_attention(at);
  // In place on the residual: the norm reads each residual value before it writes that slot.
  AddNorm post{hidden, residual, l.post_norm, a.eps, h, normed};
  linear(l.o_proj, attn, t, q_size, hidden, r.prompt_rows, &post);

  // Gated MLP (layers/activation.py): down_proj of silu(gate) * up, read from gate_up's fused rows
  // (2 * inter apart), or, where every row takes the bf16 tiles, from down_proj's A tiles that gate_up's
  // products are written into directly (the same numbers).
  const GemmArgs gu = stack_gemm_args(l.gate_up, normed, t, h, gate_up);
  GemmArgs down{gate_up, 2 * inter, t, inter, l.down.n, l.down.w, l.down.scales, l.down.mins,
                l.down.group, l.down.kind, l.down.bias, hidden};
  down.tiles = l.down.tiles;
  AddNorm next{hidden, residual, next_norm, a.eps, h, next_out};
  down.epilogue = add_norm_rows;
  down.epilogue_ctx = &next;
  if (gemm_gate_up_silu_down(gu, down, r.prompt_rows)) return;
  gemm(gu, r.prompt_rows);
  gemm_silu_mul(down, gate_up, r.prompt_rows);
}

// The last layer after its cache write, over the rows that are read alone: their queries and residual
// rows gathered, then the same steps (a row's values do not depend on the other rows, and its attention
// reads the same keys in the same order: runner/read_rows.py keeps the rows for which that holds).
void last_layer_out_rows(const StackArgs& a, const StackLayer& l, const StackCache& c, const float* q,
                         const float* residual, float* out) {
  const int64_t k = a.num_out, h = a.hidden, q_size = a.num_heads * a.head_dim;
  if (k == 0) return;
  auto qk = scratch(k * q_size), res = scratch(k * h), attn = scratch(k * q_size);
  auto hidden = scratch(k * h), normed = scratch(k * h), gate_up = scratch(k * 2 * a.intermediate);
  for (int64_t j = 0; j < k; ++j) {
    const int64_t row = a.out_rows[j];
    std::memcpy(qk.get() + j * q_size, q + row * q_size, q_size * sizeof(float));
    std::memcpy(res.get() + j * h, residual + row * h, h * sizeof(float));
  }
  const Rows r{k, a.out_query_start_loc, a.out_seq_lens, a.out_block_tables, a.out_num_seqs, a.out_prompt_rows};
  attend_and_mlp(a, l, c, r, qk.get(), res.get(), attn.get(), hidden.get(), normed.get(), gate_up.get(),
                 a.final_norm, out);
}

}  // namespace

void decoder_stack(const StackArgs& a, const StackLayer* layers, const StackCache* caches, int64_t num_layers,
                   const float* x, float* out) {
  const int64_t t = a.num_tokens, h = a.hidden, hd = a.head_dim, inter = a.intermediate;
  const int64_t q_size = a.num_heads * hd, qkv_n = q_size + 2 * a.num_kv_heads * hd;
  if (num_layers == 0) return rms_norm(x, a.final_norm, a.eps, t, h, out);
  if (t == 0) return;
  // A pure-decode step (up to 64 rows): the same values from one parallel region (decode_region.h).
  if (!a.out_query_start_loc && decode_region_applies(a, layers, num_layers))
    return decode_region_stack(a, layers, caches, num_layers, x, out);
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
    // Then the next layer's input add + norm, or after the last layer the final one into out.
    const bool last = i + 1 == num_layers;
    if (last && a.out_query_start_loc) return last_layer_out_rows(a, l, c, q.get(), residual.get(), out);
    const Rows all{t, a.query_start_loc, a.seq_lens, a.block_tables, a.num_seqs, rows};
    attend_and_mlp(a, l, c, all, q.get(), residual.get(), attn.get(), hidden.get(), normed.get(), gate_up.get(),
                   last ? a.final_norm : layers[i + 1].input_norm, last ? out : normed.get());
  }
}

// FD_DECODE_REGION_HEAD=0 keeps the head after the region (same tokens; read per step, for A/B timing).
void decoder_stack_greedy(const StackArgs& a, const StackLayer* layers, const StackCache* caches,
                          int64_t num_layers, const float* x, float* out, const StackLinear& head, int64_t* tokens) {
  const int64_t rows = a.out_query_start_loc ? a.num_out : a.num_tokens;
  const char* env = std::getenv("FD_DECODE_REGION_HEAD");
  if (num_layers > 0 && rows > 0 && !a.out_query_start_loc && is_qkind(head.kind) && !(env && env[0] == '0') &&
      decode_region_applies(a, layers, num_layers))
    return decode_region_stack(a, layers, caches, num_layers, x, out, &head, tokens);
  decoder_stack(a, layers, caches, num_layers, x, out);
  if (rows == 0) return;
  linear_argmax(stack_gemm_args(head, out, rows, a.hidden, nullptr), tokens);
}

}  // namespace fdk
