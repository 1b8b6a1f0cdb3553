// The decoder stack's decode step in one OpenMP parallel region (decode_region.cc).
//
// A pure-decode step (one query per sequence, up to 64 rows, no prompt rows, GGUF block weights) is made of
// GEMMs of a few rows, one short attention and elementwise passes over a few hundred floats each; run op by
// op, every GEMM and the attention open their own parallel region, and the fork / join of ~5 regions per
// layer costs more than the elementwise work. Here the threads enter one region for the whole stack and
// meet at barriers between dependent steps. Every value is computed by the per-op path's kernels on the
// per-op path's work items (qgemm's panel groups, paged_attention's decode items and parts), each item's
// arithmetic depending on the shapes alone, so the results are bit-identical to decoder_stack's per-op
// loop, whichever thread takes which item.
#pragma once
#include <cstdint>

#include "decoder_stack.h"
#include "kernels.h"
#include "ranges.h"

namespace fdk {

// Whether decode_region_stack can run this step (otherwise decoder_stack's per-op loop does).
bool decode_region_applies(const StackArgs& a, const StackLayer* layers, int64_t num_layers);
// With head (GGUF blocks): also tokens[r], linear_argmax's token of row r of out, from inside the region.
void decode_region_stack(const StackArgs& a, const StackLayer* layers, const StackCache* caches, int64_t num_layers,
                         const float* x, float* out, const StackLinear* head = nullptr, int64_t* tokens = nullptr);

// One decode attention work item: the GQA group of KV head g of sequence b (whose single query is token b),
// keys [k0, k1); part >= 0: its unnormalized state goes to parts + part (split-K), else the outputs.
struct DecodeItem {
  int64_t b, g, k0, k1, part;
};

// The steps the region's threads call; each runs on the calling thread alone (no parallel region).
namespace region {
// paged_attention's decode items hold a GQA group of `group` rows on the one-row-at-a-time path.
bool attn_fits(int64_t group);
int64_t keys_per_part();
// Token rows [0, t): rms_norm / fused_add_rms_norm / silu_and_mul with the same per-row arithmetic.
void norm(const float* x, const float* w, float eps, int64_t t, int64_t h, float* out);
void add_norm(const float* x, const float* res, const float* w, float eps, int64_t t, int64_t h, float* out,
              float* res_out);
void silu(const float* gate_up, int64_t t, int64_t n, float* out);
// Rows [r0, r1) of qkv_rope_to_cache.
void qkv_rows(const QkvToCacheArgs& a, int64_t r0, int64_t r1);
// Token r's part of qkv_rope_to_cache for KV heads [g0, g1): their K / V rows and their groups' q heads.
void qkv_heads(const QkvToCacheArgs& a, int64_t r, int64_t g0, int64_t g1);
// One decode item of paged_attention(a) (next: the item the calling thread takes after it, or nullptr;
// warm: the keys of w's start that the previous item prefetched, see attend_rows; returns next's) / the
// combine of its nparts consecutive parts' states into the rows' outputs (w: nparts floats of scratch).
int64_t attn_item(const AttnArgs& a, const DecodeItem& w, float* parts, const DecodeItem* next, int64_t warm);
void attn_combine(const AttnArgs& a, const DecodeItem& first, int64_t nparts, const float* parts, float* w);
// qgemm's work items for g, and the calling thread's share of them (qgemm_impl.h qgemm_share).
int64_t qgemm_items(const GemmArgs& g);
void qgemm_share(const GemmArgs& g, StealRanges& work);
// The weights of thread tid's own range of g's items (qgemm_share), in the order it reads them.
struct Bytes {
  const char* p;
  int64_t n;
};
Bytes qgemm_own_weights(const GemmArgs& g, int tid, int nth);
}  // namespace region

}  // namespace fdk
