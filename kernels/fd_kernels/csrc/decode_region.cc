// decode_region_stack(): decoder_stack's loop for a pure-decode step, in one parallel region (see
// decode_region.h for why and for the bit-identity invariant).
//
// Per layer the threads run five steps separated by barriers (region_barrier.h's, at each of which a
// thread that waits prefetches its share of the next GEMM's weights):
//   1. [every thread] add + input norm into its own buffer, then its share of the QKV GEMM;
//   2. [items claimed] per (sequence, KV head): its part of qkv_rope_to_cache (its K / V rows, its GQA
//      group's q heads), then its decode attention. Contexts over kKeysPerPart keys take the attention in
//      parts (split-K): then the rotary pass (rows split), a barrier, the parts, a barrier, the combines;
//   3. [every thread] its share of o_proj (whose weights it prefetched while waiting for step 2's end);
//   4. [every thread] add + post-attention norm into its own buffer, then its share of gate_up;
//   5. [every thread] silu(gate) * up into its own buffer, then its share of down_proj.
// Every thread computes the norms and the silu of all rows itself (the same values: a few hundred floats a
// row), so no barrier separates them from the GEMM that reads them; thread 0 alone stores the residual
// stream. The residual alternates between two buffers, so a step never writes the buffer other threads may
// still be reading. A GEMM's work ranges are reset by thread 0 one barrier before they are used and one
// barrier after their last use.

#include "argmax_rows.h"
#include "decode_region.h"
#include "region_barrier.h"
#include "scratch.h"

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <vector>

namespace fdk {

namespace {

// Rows up to which a decode step takes the region: each thread quantizes and normalizes every row itself.
constexpr int64_t kRegionMaxRows = 64;
// Most weight bytes a thread prefetches for its next GEMM while it waits (an L2 holds 1-2 MiB).
constexpr int64_t kPrefetchBytes = 256 << 10;

// Steps run through the region in this process, for the tests (fd_kernels.native.decode_region_steps).
std::atomic<int64_t> region_steps{0};
// Of those, the steps that ran the LM head inside (fd_kernels.native.decode_region_head_steps).
std::atomic<int64_t> head_steps{0};

// paged_attention's decode items for the step (the same for every layer): per sequence and KV head one
// item, or one per kKeysPerPart keys (split-K) with a combine per (sequence, KV head); split_first: the
// item of each split's first part.
struct AttnPlan {
  std::vector<DecodeItem> items;
  std::vector<int64_t> split_first, split_parts;
  int64_t part_floats = 0, max_parts = 0;
};

AttnPlan attn_plan(const StackArgs& a) {
  AttnPlan p;
  const int64_t kpp = region::keys_per_part(), group = a.num_heads / a.num_kv_heads;
  for (int64_t b = 0; b < a.num_seqs; ++b) {
    const int64_t nparts = (a.seq_lens[b] + kpp - 1) / kpp;
    for (int64_t g = 0; g < a.num_kv_heads; ++g) {
      if (nparts <= 1) {
        p.items.push_back({b, g, 0, INT64_MAX, -1});
        continue;
      }
      // Parts last to first, so that attention_items, which walks the items from the back, takes them in
      // key order (see attend_rows' prefetch past its part); their states stay in key order.
      p.split_first.push_back((int64_t)p.items.size() + nparts - 1);
      p.split_parts.push_back(nparts);
      p.max_parts = std::max(p.max_parts, nparts);
      const int64_t stride = group * (a.head_dim + 2);
      for (int64_t j = nparts - 1; j >= 0; --j)
        p.items.push_back({b, g, j * kpp, (j + 1) * kpp, p.part_floats + j * stride});
      p.part_floats += nparts * stride;
    }
  }
  return p;
}

// The shared state of one step's region.
struct Region {
  const StackArgs& a;
  const StackLayer* layers;
  const StackCache* caches;
  int64_t num_layers;
  const float* x;
  float* out;
  int64_t q_size, qkv_n;
  AttnPlan plan;
  Scratch res[2], hidden, qkv, q, attn, gate_up, parts, own;
  int64_t own_stride;  // per thread: normed [t, h], sum [t, h], act [t, inter]
  std::unique_ptr<std::atomic<int64_t>[]> next;  // per layer: the attention items claimed
  StealRanges work[2];
  SpinBarrier bar;
  // The LM head (decode_region_stack's head): its GEMM (g.a set per thread) into `logits`, each thread's
  // share of every row's scan into argmax[r * nth + tid].
  const GemmArgs* head = nullptr;
  std::vector<ArgMax> argmax;
  int nth = 1;
  bool prefetch = true;  // SpinBarrier with prefetches while waiting, else omp barriers and none
  Region(const StackArgs& a_, const StackLayer* l, const StackCache* c, int64_t n, const float* x_, float* o)
      : a(a_), layers(l), caches(c), num_layers(n), x(x_), out(o), work{StealRanges(0), StealRanges(0)} {}
};

// A thread's own state in the region.
struct Thread {
  int tid, nth, sense = 0;
  Prefetcher pf;
};

// The barrier between dependent steps. While it waits, the thread prefetches the first kPrefetchBytes of
// its own share of *next's weights (if next) (the GEMM after the barrier or one further on): a GEMM of a few rows
// streams its weights from memory, and a thread that starts it with them already in L2 neither waits for
// the first lines nor for the hardware prefetcher to ramp up. Prefetching before an omp barrier instead
// delays the thread's arrival by the prefetches' own memory time.
void sync(Region& s, Thread& th, const GemmArgs* next) {
  if (!s.prefetch) {
#pragma omp barrier
    return;
  }
  if (!next) return s.bar.wait(th.sense, [] { return false; });
  const region::Bytes w = region::qgemm_own_weights(*next, th.tid, th.nth);
  th.pf.set(w.p, std::min(w.n, kPrefetchBytes));
  s.bar.wait(th.sense, [&] { return th.pf.step(); });
}

// Thread 0 sets work[i] up for g, between barriers (see the top of this file).
void reset_work(Region& s, int i, const GemmArgs& g) {
  if (omp_get_thread_num() == 0) s.work[i].reset(region::qgemm_items(g));
}

// The layer's attention items, in runs of left / (2 x threads) (ranges.h ItemRuns): longer than
// paged_attention's, whose loop also takes prompt tiles, since here every item is a decode item of at most
// kKeysPerPart keys; each item prefetches the first keys of the item its thread takes next (attend_rows'
// next). With qc, each item first writes its own KV head's rows of the token and its GQA group's q heads
// (only when no item is split: then each (sequence, KV head) is one item, the only reader of what it
// writes).
void attention_items(Region& s, const AttnArgs& at, int64_t i, int nth, const QkvToCacheArgs* qc) {
  const int64_t nitems = (int64_t)s.plan.items.size();
  ItemRuns runs(s.next[i], nitems, 2 * nth);
  int64_t warm = 0;
  for (int64_t it; (it = runs.next()) < nitems;) {
    const int64_t nit = runs.following();
    const DecodeItem& w = s.plan.items[nitems - 1 - it];
    const DecodeItem* nx = nit < nitems ? &s.plan.items[nitems - 1 - nit] : nullptr;
    if (qc) region::qkv_heads(*qc, s.a.query_start_loc[w.b], w.g, w.g + 1);
    warm = region::attn_item(at, w, s.parts.get(), nx, warm);
  }
}

// The split-K combines, after a barrier that every part's item has passed.
void attention_combine(Region& s, const AttnArgs& at, int tid, int nth) {
  const int64_t nsplits = (int64_t)s.plan.split_first.size();
  std::vector<float> w(s.plan.max_parts);
  for (int64_t j = tid; j < nsplits; j += nth)
    region::attn_combine(at, s.plan.items[s.plan.split_first[j]], s.plan.split_parts[j], s.parts.get(), w.data());
}

// Layer i; *res is the residual stream's buffer (x for layer 0), *nx the one its next add writes.
void layer(Region& s, int64_t i, const float** res, int* nx, Thread& th) {
  const StackArgs& a = s.a;
  const StackLayer& l = s.layers[i];
  const int64_t t = a.num_tokens, h = a.hidden, inter = a.intermediate;
  const int tid = th.tid, nth = th.nth;
  float* own = s.own.get() + tid * s.own_stride;
  float *normed = own, *sum = own + t * h, *act = own + 2 * t * h;
  auto add_norm = [&](const float* w) {
    float* res_out = tid == 0 ? s.res[*nx].get() : sum;
    region::add_norm(s.hidden.get(), *res, w, a.eps, t, h, normed, res_out);
    *res = s.res[*nx].get();
    *nx ^= 1;
  };
  const GemmArgs go = stack_gemm_args(l.o_proj, s.attn.get(), t, s.q_size, s.hidden.get());
  const GemmArgs gu = stack_gemm_args(l.gate_up, normed, t, h, s.gate_up.get());
  const GemmArgs gd = stack_gemm_args(l.down, act, t, inter, s.hidden.get());
  if (i == 0) {
    region::norm(s.x, l.input_norm, a.eps, t, h, normed);
  } else {
    add_norm(l.input_norm);
  }
  region::qgemm_share(stack_gemm_args(l.qkv, normed, t, h, s.qkv.get()), s.work[0]);
  reset_work(s, 1, go);
  sync(s, th, &go);
  const StackCache& c = s.caches[i];
  QkvToCacheArgs qc{s.qkv.get(), t,         a.num_heads, a.num_kv_heads, a.head_dim, a.positions,
                    a.cos_sin,   l.q_norm,  l.k_norm,    a.eps,          s.q.get(),  c.k_cache,
                    c.v_cache,   c.k_scales, c.v_scales, c.kv_kind,      a.slot_mapping, a.block_size};
  const AttnArgs at{s.q.get(),  c.k_cache,    c.v_cache,   a.query_start_loc, a.seq_lens,   a.block_tables,
                    a.num_seqs, a.max_blocks, a.num_heads, a.num_kv_heads,    a.block_size, a.head_dim,
                    a.scale,    s.attn.get(), c.k_scales,  c.v_scales,        c.kv_kind};
  if (s.plan.split_first.empty()) {
    attention_items(s, at, i, nth, &qc);
  } else {
    region::qkv_rows(qc, t * tid / nth, t * (tid + 1) / nth);
    sync(s, th, &go);
    attention_items(s, at, i, nth, nullptr);
    sync(s, th, &go);
    attention_combine(s, at, tid, nth);
  }
  sync(s, th, &go);
  region::qgemm_share(go, s.work[1]);
  reset_work(s, 0, gu);
  sync(s, th, &gu);
  add_norm(l.post_norm);
  region::qgemm_share(gu, s.work[0]);
  reset_work(s, 1, gd);
  sync(s, th, &gd);
  region::silu(s.gate_up.get(), t, inter, act);
  region::qgemm_share(gd, s.work[1]);
  if (i + 1 < s.num_layers) {
    const GemmArgs gq = stack_gemm_args(s.layers[i + 1].qkv, normed, t, h, s.qkv.get());
    reset_work(s, 0, gq);
    sync(s, th, &gq);
  } else if (s.head) {
    reset_work(s, 0, *s.head);
    sync(s, th, s.head);
  } else {
    sync(s, th, nullptr);
  }
}

// After the last layer, with the head: every thread normalizes all rows into its own buffer (the values
// the split norm stores in out, which it still stores, its own rows), takes its share of the head's GEMM
// on them (its rows quantized by itself, as every GEMM of the region) and after a barrier its share of
// each row's argmax scan; the caller combines the shares after the region.
void head_and_scan(Region& s, const float* res, Thread& th) {
  const StackArgs& a = s.a;
  const int64_t t = a.num_tokens, h = a.hidden, n = s.head->n;
  float* own = s.own.get() + th.tid * s.own_stride;
  region::add_norm(s.hidden.get(), res, a.final_norm, a.eps, t, h, own, own + t * h);
  const int64_t r0 = t * th.tid / th.nth, r1 = t * (th.tid + 1) / th.nth;
  std::memcpy(s.out + r0 * h, own + r0 * h, (r1 - r0) * h * sizeof(float));
  GemmArgs g = *s.head;
  g.a = own;
  region::qgemm_share(g, s.work[0]);
  sync(s, th, nullptr);
  argmax_share(g.c, t, n, th.tid, th.nth, s.argmax.data());
}

}  // namespace

bool decode_region_applies(const StackArgs& a, const StackLayer* layers, int64_t num_layers) {
  const int64_t t = a.num_tokens;
  // FD_DECODE_REGION=0 keeps every step on the per-op loop (same results; for A/B timing). Read per step,
  // so a benchmark can alternate the two in one process.
  const char* env = std::getenv("FD_DECODE_REGION");
  if (env && env[0] == '0') return false;
  if (t < 1 || t > kRegionMaxRows || a.num_seqs != t || !region::attn_fits(a.num_heads / a.num_kv_heads))
    return false;
  for (int64_t b = 0; b <= t; ++b)
    if (a.query_start_loc[b] != b) return false;
  for (int64_t r = 0; a.prompt_rows && r < t; ++r)
    if (a.prompt_rows[r]) return false;
  for (int64_t i = 0; i < num_layers; ++i) {
    const StackLayer& l = layers[i];
    for (const StackLinear* w : {&l.qkv, &l.o_proj, &l.gate_up, &l.down})
      if (!is_qkind(w->kind)) return false;
  }
  return true;
}

void decode_region_stack(const StackArgs& a, const StackLayer* layers, const StackCache* caches, int64_t num_layers,
                         const float* x, float* out, const StackLinear* head, int64_t* tokens) {
  const int64_t t = a.num_tokens, h = a.hidden, inter = a.intermediate;
  region_steps.fetch_add(1, std::memory_order_relaxed);
  Region s(a, layers, caches, num_layers, x, out);
  s.q_size = a.num_heads * a.head_dim;
  s.qkv_n = s.q_size + 2 * a.num_kv_heads * a.head_dim;
  s.plan = attn_plan(a);
  // FD_DECODE_REGION_PREFETCH=0: omp barriers and no prefetches (same results; read per step, for A/B).
  const char* pf_env = std::getenv("FD_DECODE_REGION_PREFETCH");
  s.prefetch = !(pf_env && pf_env[0] == '0');
  for (auto& r : s.res) r = scratch(t * h);
  s.hidden = scratch(t * h);
  s.qkv = scratch(t * s.qkv_n);
  s.q = scratch(t * s.q_size);
  s.attn = scratch(t * s.q_size);
  s.gate_up = scratch(t * 2 * inter);
  s.parts = scratch(s.plan.part_floats);
  const int max_threads = omp_get_max_threads();
  s.own_stride = (2 * t * h + t * inter + 15) / 16 * 16;
  s.own = scratch(max_threads * s.own_stride);
  s.next.reset(new std::atomic<int64_t>[num_layers]);
  for (int64_t i = 0; i < num_layers; ++i) s.next[i].store(0, std::memory_order_relaxed);
  // work[0] starts on layer 0's QKV; work[1] is reset inside, before its first use (o_proj).
  s.work[0].reset(region::qgemm_items(stack_gemm_args(layers[0].qkv, x, t, h, s.qkv.get())));
  std::vector<float> logits_once;
  GemmArgs head_g{};
  if (head) {
    // The plan gives the head no tiles (it never takes prompt rows): these are linear_argmax's GemmArgs.
    head_g = stack_gemm_args(*head, nullptr, t, h, logits_scratch(t * head->n, logits_once));
    s.head = &head_g;
    s.argmax.resize(t * max_threads);
    head_steps.fetch_add(1, std::memory_order_relaxed);
  }
#pragma omp parallel
  {
    const int tid = omp_get_thread_num(), nth = omp_get_num_threads();
    if (tid == 0) s.bar.init(nth), s.nth = nth;
#pragma omp barrier
    Thread th{tid, nth};
    const float* res = x;
    int nx = 0;
    for (int64_t i = 0; i < num_layers; ++i) layer(s, i, &res, &nx, th);
    if (s.head) {
      head_and_scan(s, res, th);
    } else {
      const int64_t r0 = t * tid / nth, r1 = t * (tid + 1) / nth;
      region::add_norm(s.hidden.get() + r0 * h, res + r0 * h, a.final_norm, a.eps, r1 - r0, h, out + r0 * h,
                       s.res[nx].get() + r0 * h);
    }
  }
  if (head) argmax_combine(s.argmax.data(), t, s.nth, tokens);
}

}  // namespace fdk

extern "C" int64_t fd_decode_region_steps() { return fdk::region_steps.load(std::memory_order_relaxed); }
extern "C" int64_t fd_decode_region_head_steps() { return fdk::head_steps.load(std::memory_order_relaxed); }
