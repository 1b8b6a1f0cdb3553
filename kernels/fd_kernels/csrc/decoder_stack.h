// The whole Llama-family decoder stack (N x [norm, QKV, q/k norm, rotary, cache write, paged attention,
// o_proj, add+norm, gate_up, silu_and_mul, down] and the final add+norm) as one call over raw pointers.
// It computes every value with the arithmetic, and in the order, of the per-op Python path
// (fdcli_engine/models/decoder.py, layers/attention.py), fusing only elementwise passes between the
// GEMMs and attention, so the two paths give bit-identical results; the gain is one Paddle dispatch per
// step instead of ~12 a layer, and fewer passes over the activations.
// Nothing here knows about Paddle (decoder_stack_op.cc is the glue).
#pragma once
#include <cstdint>

#include "kernels.h"

namespace fdk {

// A packed linear as fd_linear takes it (see GemmArgs); k comes from the stack's dimensions.
struct StackLinear {
  const void* w;
  const float* scales;
  const float* mins;
  const float* bias;  // nullptr: no bias
  const uint16_t* tiles;  // the AMX tiles (GemmArgs::tiles), or nullptr
  int64_t n, group;
  int kind;
};

struct StackLayer {
  const float* input_norm;  // [hidden]
  const float* post_norm;   // [hidden]
  const float* q_norm;      // [head_dim] per-head q/k RMSNorm before rotary (Qwen3), else nullptr
  const float* k_norm;
  StackLinear qkv, o_proj, gate_up, down;
};

// One layer's KV cache: [nb, nkv, bs, hd] of kv_kind's element type (kernels.h KvKind): float, bf16 bits,
// or int8 codes with per-row scales [nb, nkv, bs] (C8).
struct StackCache {
  void* k_cache;
  void* v_cache;
  float* k_scales;  // nullptr unless C8
  float* v_scales;
  int kv_kind;
};

struct StackArgs {
  int64_t num_tokens, hidden, num_heads, num_kv_heads, head_dim, intermediate;
  float eps;    // every RMSNorm of the stack (input, post-attention, q/k, final)
  float scale;  // attention softmax scale
  const int64_t* positions;        // [T]
  const float* cos_sin;            // [max_pos, hd]
  const int64_t* slot_mapping;     // [T]
  const int64_t* query_start_loc;  // [B + 1]
  const int64_t* seq_lens;         // [B]
  const int64_t* block_tables;     // [B, max_blocks]
  int64_t num_seqs, max_blocks, block_size;
  const uint8_t* prompt_rows;  // [T] or nullptr: passed to every gemm, as fd_linear gets it
  const float* final_norm;     // [hidden]
  // The rows whose output is read (fdcli_engine/runner/read_rows.py), or out_query_start_loc == nullptr:
  // every row.
  // With them, the last layer still writes every row's K/V, but attends, projects and normalizes only
  // these rows (sorted, each sequence's a suffix of its rows), as the attention metadata out_* of these
  // rows alone describes them (their own query_start_loc and prompt-row mask; the sequences that have
  // such rows, with their seq_lens and block tables), and `out` holds only them.
  const int64_t* out_rows;  // [num_out]
  int64_t num_out;
  const int64_t* out_query_start_loc;  // [out_num_seqs + 1]
  const int64_t* out_seq_lens;         // [out_num_seqs]
  const int64_t* out_block_tables;     // [out_num_seqs, max_blocks]
  int64_t out_num_seqs;
  const uint8_t* out_prompt_rows;  // [num_out] or nullptr
};

// x: the embedded tokens [T, hidden]; out: the final norm's output [T, hidden] (or [num_out, hidden], the
// out_rows). Writes the KV caches of every row.
// The GemmArgs of linear l on x [t, k] into c [t, l.n] (with its AMX tiles, no epilogue): one place that
// reads a StackLinear for the per-op loop, the decode region and the LM head.
inline GemmArgs stack_gemm_args(const StackLinear& l, const float* x, int64_t t, int64_t k, float* c) {
  GemmArgs g{x, k, t, k, l.n, l.w, l.scales, l.mins, l.group, l.kind, l.bias, c};
  g.tiles = l.tiles;
  return g;
}

void decoder_stack(const StackArgs& a, const StackLayer* layers, const StackCache* caches, int64_t num_layers,
                   const float* x, float* out);

// decoder_stack, then tokens[r]: linear_argmax of the LM head `head` on row r of out. A pure-decode step
// whose head is GGUF blocks runs the head's GEMM and scan inside the decode region (decode_region.h), with
// the same bits and tokens.
void decoder_stack_greedy(const StackArgs& a, const StackLayer* layers, const StackCache* caches,
                          int64_t num_layers, const float* x, float* out, const StackLinear& head, int64_t* tokens);

// out[r]: the first argmax of row r of gemm(g) (ties to the lowest column), or -1 where the row holds a
// NaN; the logits go to a scratch buffer of the calling thread, not g.c (csrc/lm_head_argmax.cc).
void linear_argmax(GemmArgs g, int64_t* out);

}  // namespace fdk
