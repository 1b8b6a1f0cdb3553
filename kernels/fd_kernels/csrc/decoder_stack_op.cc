// Paddle glue of fdk::decoder_stack (decoder_stack.h), in three ops so that a step hands over only its
// own few tensors: Paddle's cost of handing a custom op every weight tensor (hundreds) would be a large
// part of the decode step the stack is for (docs/kernels-measurements.md).
//
//   fd_decoder_stack_plan(FinalNorm, CosSin, Embedding, Weights[]) -> weight plan, once after loading.
//     Embedding: the token table the step op may look rows up in (embed_kind a GGUF block kind: the packed
//     blocks fd_linear_rows reads; kF32: float32 [embed_rows, hidden] as F.embedding reads it; -1: none,
//     an empty tensor). With has_head, Weights ends with the LM head's five tensors (as a layer's linear,
//     its linear_meta last): the step op can then also give each row's greedy token. Weights holds
//     per layer kPerLayer tensors (kPerLayerQkNorm with per-head q/k norms), in this order:
//     input_norm, qkv{packed, scales, mins, bias, tiles}, o_proj{..}, post_norm, gate_up{..}, down{..},
//     [q_norm, k_norm]; linear_meta per layer and linear (qkv, o_proj, gate_up, down): n, kind, group,
//     has_bias.
//   fd_decoder_stack_bind(Plan, KVCaches[]) -> cache plan, once per set of caches. KVCaches holds per
//     layer (k_cache, v_cache) fp32 or bf16, or (k_cache, v_cache, k_scales, v_scales) for the C8 cache.
//   fd_decoder_stack(X, metadata, PromptRows, Plan, CachePlan, out-rows metadata) -> Out, every step. X:
//     the embedded tokens float32 [T, hidden], or token ids int64 [T] whose rows the op takes from the
//     plan's embedding (the values fd_linear_rows / F.embedding give, so one op a step). greedy (a plan
//     with the head): Tokens holds each output row's first argmax of the head's logits, as
//     fd_linear_argmax gives it (-1 for a row with a NaN logit); else Tokens is empty. The
//     out-rows metadata (StackArgs::out_*), all empty for every row, limits the last layer to the rows read.
//
// A plan is an int64 tensor whose bytes are a header and one record per layer, holding raw pointers
// into the tensors it was built from: everything is checked when it is built (as fd_linear, fd_rms_norm
// and the attention ops check their inputs), and the Python side (fd_kernels.native.DecoderStack) keeps
// those tensors alive as long as the plan. The step op writes the KV caches through the cache plan's
// pointers, in place (Paddle does not see them: no autograd, which the engine never records anyway).
// The step's metadata is checked every step, as paged_attention checks it.

#include <cstdio>
#include <cstring>
#include <exception>
#include <vector>

#include "decoder_stack.h"
#include "glue.h"
#include "paddle/extension.h"
#include "scratch.h"

namespace {

using paddle::Tensor;

constexpr int64_t kPerLinear = 5, kPerLayer = 2 + 4 * kPerLinear, kPerLayerQkNorm = kPerLayer + 2, kMetaPerLayer = 16;

using fdglue::as_i64;
using fdglue::contig;

// A weight the kernels read by raw pointer: CPU, contiguous (never copied, the pointer must be its own),
// of the given dtype and at least `numel` elements.
const void* weight_ptr(const Tensor& x, paddle::DataType dt, int64_t numel, const char* what, int64_t layer) {
  PD_CHECK(x.is_cpu() && x.is_contiguous() && x.dtype() == dt, "decoder_stack: layer ", layer, " ", what,
           " has the wrong dtype or layout");
  PD_CHECK(x.numel() >= numel, "decoder_stack: layer ", layer, " ", what, " has ", x.numel(),
           " elements, expected ", numel);
  return x.data();
}

const float* f32_ptr(const Tensor& x, int64_t numel, const char* what, int64_t layer) {
  return static_cast<const float*>(weight_ptr(x, paddle::DataType::FLOAT32, numel, what, layer));
}

// The five tensors of a packed linear with k inputs, checked as fd_linear checks them (plus the sizes
// of scales / mins / bias, which fd_linear trusts).
fdk::StackLinear stack_linear(const Tensor* t, const int64_t* meta, int64_t k, const char* what, int64_t layer) {
  fdk::StackLinear l{};
  l.n = meta[0];
  l.kind = (int)meta[1];
  l.group = meta[2];
  const bool has_bias = meta[3] != 0;
  PD_CHECK(l.n > 0 && l.kind >= fdk::kF32 && l.kind <= fdk::kQ8_0, "decoder_stack: layer ", layer, " ", what,
           " has bad metadata");
  const int64_t panels = (l.n + fdk::kNR - 1) / fdk::kNR;
  const int64_t elems = fdk::packed_elems(l.kind, l.n, k);
  l.w = weight_ptr(t[0], fdglue::packed_dtype(l.kind), elems, what, layer);
  PD_CHECK(elems >= 0 && t[0].numel() == elems, "decoder_stack: layer ", layer, " ", what,
           " does not match its input width ", k);
  int64_t groups = 0;
  if (l.kind == fdk::kS8 || l.kind == fdk::kU4) {
    PD_CHECK(l.group > 0, "decoder_stack: layer ", layer, " ", what, " has group ", l.group);
    groups = (k + l.group - 1) / l.group;
  }
  l.scales = f32_ptr(t[1], groups ? panels * groups * fdk::kNR : 0, what, layer);
  l.mins = f32_ptr(t[2], l.kind == fdk::kU4 ? panels * groups * fdk::kNR : 0, what, layer);
  l.bias = has_bias ? f32_ptr(t[3], panels * fdk::kNR, what, layer) : nullptr;
  l.tiles = fdglue::tiles_ptr(t[4], l.kind, l.n, k, what);
  return l;
}

// Plan headers; see the top of this file.
constexpr uint64_t kWeightMagic = 0x66645f737461636bULL, kCacheMagic = 0x66645f6b76636163ULL;

struct WeightPlan {  // followed by num_layers StackLayer
  uint64_t magic;
  int64_t num_layers, hidden, num_heads, num_kv_heads, head_dim, intermediate, max_position;
  float eps, scale;
  const float* final_norm;
  const float* cos_sin;
  const void* embed;  // the token table, or nullptr (see fd_decoder_stack_plan above)
  int64_t embed_rows, embed_kind;
  fdk::StackLinear head;  // the LM head (fd_linear_argmax's weight), or head.w == nullptr
  const fdk::StackLayer* layers() const { return reinterpret_cast<const fdk::StackLayer*>(this + 1); }
};

struct CachePlan {  // followed by num_layers StackCache
  uint64_t magic;
  int64_t num_layers, num_kv_heads, head_dim, num_blocks, block_size;
  const fdk::StackCache* caches() const { return reinterpret_cast<const fdk::StackCache*>(this + 1); }
};

// An int64 tensor of at least `bytes` bytes, zeroed (the plan's storage).
Tensor plan_tensor(int64_t bytes, const paddle::Place& place) {
  Tensor t = paddle::empty({(bytes + 7) / 8}, paddle::DataType::INT64, place);
  std::memset(t.data<int64_t>(), 0, t.numel() * sizeof(int64_t));
  return t;
}

// The plan `words` int64 words at `data` hold, checked for its kind and size (a stray buffer must not be
// read as pointers).
template <typename Plan, typename Record>
const Plan* read_plan(const int64_t* data, int64_t words, uint64_t magic, const char* what) {
  PD_CHECK(data != nullptr && words * 8 >= (int64_t)sizeof(Plan), "decoder_stack: ", what,
           " is not a plan built by fd_kernels.native");
  const Plan* p = reinterpret_cast<const Plan*>(data);
  const int64_t bytes = (int64_t)(sizeof(Plan) + p->num_layers * sizeof(Record));
  PD_CHECK(p->magic == magic && p->num_layers >= 0 && words == (bytes + 7) / 8, "decoder_stack: ", what,
           " is not a plan built by fd_kernels.native");
  return p;
}

template <typename Plan, typename Record>
const Plan* read_plan(const Tensor& t, uint64_t magic, const char* what) {
  PD_CHECK(t.is_cpu() && t.dtype() == paddle::DataType::INT64 && t.is_contiguous(), "decoder_stack: ", what,
           " is not a plan built by fd_kernels.native");
  return read_plan<Plan, Record>(t.data<int64_t>(), t.numel(), magic, what);
}

// Layer i's caches, shaped like layer 0's, of layer 0's dtype dt: [nb, nkv, bs, hd] fp32 or bf16, or int8
// with fp32 scales [nb, nkv, bs].
fdk::StackCache stack_cache(const Tensor* c, bool c8, paddle::DataType dt, const std::vector<int64_t>& shape,
                            int64_t i) {
  PD_CHECK(c8 ? dt == paddle::DataType::INT8 : dt == paddle::DataType::FLOAT32 || dt == paddle::DataType::BFLOAT16,
           "decoder_stack: KV caches must be float32 or bfloat16 (2 per layer) or int8 with scales (4 per layer)");
  for (int j = 0; j < 2; ++j)
    PD_CHECK(c[j].is_cpu() && c[j].is_contiguous() && c[j].dtype() == dt && c[j].shape() == shape,
             "decoder_stack: layer ", i, " KV cache must be contiguous [nb,nkv,bs,hd] of layer 0's dtype");
  const int kind = c8 ? fdk::kKvS8 : dt == paddle::DataType::BFLOAT16 ? fdk::kKvBF16 : fdk::kKvF32;
  fdk::StackCache out{const_cast<void*>(c[0].data()), const_cast<void*>(c[1].data()), nullptr, nullptr, kind};
  if (!c8) return out;
  const std::vector<int64_t> ss(shape.begin(), shape.end() - 1);
  for (int j = 2; j < 4; ++j)
    PD_CHECK(c[j].is_cpu() && c[j].is_contiguous() && c[j].dtype() == paddle::DataType::FLOAT32 &&
                 c[j].shape() == ss,
             "decoder_stack: layer ", i, " KV scales must be contiguous float32 [nb,nkv,bs]");
  out.k_scales = static_cast<float*>(const_cast<void*>(c[2].data()));
  out.v_scales = static_cast<float*>(const_cast<void*>(c[3].data()));
  return out;
}

// Sequences of t query rows (query_start_loc, seq_lens, block tables) against the cache, as ops.cc checks them.
void check_seqs(const fdk::StackArgs& a, int64_t t, int64_t num_blocks, const std::vector<int64_t>& qsl,
                const std::vector<int64_t>& lens, const std::vector<int64_t>& bt) {
  const int64_t nseq = (int64_t)lens.size();
  PD_CHECK((int64_t)qsl.size() == nseq + 1 && qsl[0] == 0 && qsl[nseq] == t && (int64_t)bt.size() == nseq * a.max_blocks,
           "decoder_stack: query_start_loc / block_tables mismatch");
  for (int64_t b = 0; b < nseq; ++b) {
    const int64_t nq = qsl[b + 1] - qsl[b];
    PD_CHECK(nq >= 0 && nq <= lens[b], "decoder_stack: sequence ", b, " has more queries than context");
    PD_CHECK(lens[b] <= a.max_blocks * a.block_size, "decoder_stack: block table too short for sequence ", b);
    for (int64_t j = 0; j < (lens[b] + a.block_size - 1) / a.block_size; ++j)
      PD_CHECK(bt[b * a.max_blocks + j] >= 0 && bt[b * a.max_blocks + j] < num_blocks,
               "decoder_stack: bad block id");
  }
}

// Positions, slots and block tables against the cache and rotary table sizes, as ops.cc checks them.
void check_metadata(const fdk::StackArgs& a, int64_t t, int64_t max_pos, int64_t num_blocks,
                    const std::vector<int64_t>& pos, const std::vector<int64_t>& slots,
                    const std::vector<int64_t>& qsl, const std::vector<int64_t>& lens,
                    const std::vector<int64_t>& bt) {
  PD_CHECK((int64_t)pos.size() == t && (int64_t)slots.size() == t,
           "decoder_stack: positions and slot_mapping must have one entry per token");
  for (int64_t p : pos) PD_CHECK(p >= 0 && p < max_pos, "decoder_stack: position ", p, " out of range");
  for (int64_t s : slots) PD_CHECK(s < num_blocks * a.block_size, "decoder_stack: slot ", s, " beyond the cache");
  check_seqs(a, t, num_blocks, qsl, lens, bt);
}

// The read rows' own metadata (StackArgs::out_*), checked like the step's; `held` keeps the arrays alive.
struct OutRows {
  std::vector<int64_t> rows, qsl, lens, bt;
};

void set_out_rows(fdk::StackArgs& a, int64_t t, int64_t num_blocks, OutRows& o, const Tensor& prompt_rows) {
  int64_t prev = -1;
  for (int64_t r : o.rows) {
    PD_CHECK(r > prev && r < t, "decoder_stack: out_rows must be increasing rows of the step");
    prev = r;
  }
  const int64_t k = (int64_t)o.rows.size();
  check_seqs(a, k, num_blocks, o.qsl, o.lens, o.bt);
  a.out_rows = o.rows.data();
  a.num_out = k;
  a.out_query_start_loc = o.qsl.data();
  a.out_seq_lens = o.lens.data();
  a.out_block_tables = o.bt.data();
  a.out_num_seqs = (int64_t)o.lens.size();
  a.out_prompt_rows = fdglue::prompt_rows_of(prompt_rows, k, "decoder_stack");
}

// The plan's token table, checked as fd_linear_rows (GGUF blocks) or F.embedding (float32 rows) take it.
void set_embedding(WeightPlan& p, const Tensor& table, int64_t rows, int64_t kind) {
  if (kind < 0) return;
  const bool blocks = fdk::is_qkind((int)kind);
  PD_CHECK(rows > 0 && (blocks || kind == fdk::kF32), "decoder_stack: bad embedding metadata");
  const paddle::DataType dt = blocks ? paddle::DataType::UINT8 : paddle::DataType::FLOAT32;
  const int64_t elems = blocks ? fdk::packed_elems((int)kind, rows, p.hidden) : rows * p.hidden;
  p.embed = weight_ptr(table, dt, elems, "embedding", p.num_layers);
  PD_CHECK(table.numel() == elems, "decoder_stack: the embedding does not match its rows and hidden_size");
  p.embed_rows = rows;
  p.embed_kind = kind;
}

// Rows `ids` of the plan's token table into out [ids.size(), hidden], each id checked.
void embed_tokens(const WeightPlan& p, const std::vector<int64_t>& ids, float* out) {
  PD_CHECK(p.embed != nullptr, "decoder_stack: token ids given, but the plan holds no embedding");
  for (int64_t v : ids)
    PD_CHECK(v >= 0 && v < p.embed_rows, "token id ", v, " is outside the vocabulary [0, ", p.embed_rows, ")");
  const int64_t t = (int64_t)ids.size(), h = p.hidden;
  if (p.embed_kind != fdk::kF32) {
    fdk::q_rows(p.embed, (int)p.embed_kind, h, ids.data(), t, out);
    return;
  }
  const float* table = static_cast<const float*>(p.embed);
  for (int64_t i = 0; i < t; ++i) std::memcpy(out + i * h, table + ids[i] * h, h * sizeof(float));
}

// A step's metadata as the stack reads it, int64: the op converts its tensors, the ctypes entry its arrays,
// and both build the step's StackArgs from it with step_args (one set of checks for both).
struct StepRows {
  std::vector<int64_t> pos, slots, qsl, lens, bt;
};

void check_plans(const WeightPlan& p, const CachePlan& c, bool greedy) {
  PD_CHECK(c.num_layers == p.num_layers && c.num_kv_heads == p.num_kv_heads && c.head_dim == p.head_dim,
           "decoder_stack: the caches were bound for another model");
  PD_CHECK(!greedy || p.head.w != nullptr, "decoder_stack: greedy tokens asked of a plan without the LM head");
}

// The StackArgs of a step of t rows, its metadata checked; they point into `m`, which must outlive them.
// No prompt rows and no out rows: the caller sets those.
fdk::StackArgs step_args(const WeightPlan& p, const CachePlan& c, int64_t t, const StepRows& m) {
  fdk::StackArgs a{};
  a.num_tokens = t;
  a.hidden = p.hidden;
  a.num_heads = p.num_heads;
  a.num_kv_heads = p.num_kv_heads;
  a.head_dim = p.head_dim;
  a.intermediate = p.intermediate;
  a.eps = p.eps;
  a.scale = p.scale;
  a.cos_sin = p.cos_sin;
  a.final_norm = p.final_norm;
  a.block_size = c.block_size;
  a.num_seqs = (int64_t)m.lens.size();
  a.max_blocks = a.num_seqs ? (int64_t)m.bt.size() / a.num_seqs : 0;
  check_metadata(a, t, p.max_position, c.num_blocks, m.pos, m.slots, m.qsl, m.lens, m.bt);
  a.positions = m.pos.data();
  a.slot_mapping = m.slots.data();
  a.query_start_loc = m.qsl.data();
  a.seq_lens = m.lens.data();
  a.block_tables = m.bt.data();
  a.prompt_rows = nullptr;
  return a;
}

// The rows of token ids, looked up in the plan's table into `s` (the op's own scratch, which only the stack
// reads: not a Paddle tensor, one allocation less through Paddle's allocator a step).
const float* embed_ids(const WeightPlan& p, const std::vector<int64_t>& ids, fdk::Scratch& s) {
  s = fdk::scratch((int64_t)ids.size() * p.hidden);
  embed_tokens(p, ids, s.get());
  return s.get();
}

}  // namespace

std::vector<Tensor> DecoderStackPlan(const Tensor& final_norm, const Tensor& cos_sin, const Tensor& embedding,
                                     const std::vector<Tensor>& weights, const std::vector<int64_t>& linear_meta,
                                     int64_t hidden, int64_t num_heads, int64_t num_kv_heads, int64_t head_dim,
                                     bool qk_norm, float eps, float scale, int64_t embed_rows, int64_t embed_kind,
                                     bool has_head) {
  const int64_t per_layer = qk_norm ? kPerLayerQkNorm : kPerLayer;
  const int64_t layer_weights = (int64_t)weights.size() - (has_head ? kPerLinear : 0);
  const int64_t num_layers = layer_weights / per_layer;
  PD_CHECK(num_layers > 0 && layer_weights == num_layers * per_layer &&
               (int64_t)linear_meta.size() == num_layers * kMetaPerLayer + (has_head ? 4 : 0),
           "decoder_stack: weights / linear_meta do not describe whole layers");
  PD_CHECK(hidden > 0 && num_heads > 0 && num_kv_heads > 0 && num_heads % num_kv_heads == 0 && head_dim > 0 &&
               head_dim % 2 == 0 && head_dim <= 512,
           "decoder_stack: bad head configuration");
  PD_CHECK(cos_sin.is_cpu() && cos_sin.is_contiguous() && cos_sin.dtype() == paddle::DataType::FLOAT32 &&
               cos_sin.shape().size() == 2 && cos_sin.shape()[1] == head_dim,
           "decoder_stack: cos_sin_cache must be contiguous float32 [max_pos, head_dim]");
  PD_CHECK(linear_meta[8] > 0 && linear_meta[8] % 2 == 0, "decoder_stack: gate_up must have an even width");
  Tensor plan = plan_tensor(sizeof(WeightPlan) + num_layers * sizeof(fdk::StackLayer), cos_sin.place());
  WeightPlan* p = reinterpret_cast<WeightPlan*>(plan.data<int64_t>());
  *p = WeightPlan{kWeightMagic, num_layers, hidden, num_heads, num_kv_heads, head_dim, linear_meta[8] / 2,
                  cos_sin.shape()[0], eps, scale, nullptr, cos_sin.data<float>(), nullptr, 0, -1, {}};
  PD_CHECK(final_norm.numel() == hidden, "decoder_stack: final norm must have hidden_size elements");
  p->final_norm = f32_ptr(final_norm, hidden, "final norm", num_layers);
  set_embedding(*p, embedding, embed_rows, embed_kind);
  if (has_head)
    p->head = stack_linear(weights.data() + layer_weights, linear_meta.data() + num_layers * kMetaPerLayer, hidden,
                           "lm_head", num_layers);
  const int64_t q_size = num_heads * head_dim, kv_size = num_kv_heads * head_dim;
  fdk::StackLayer* layers = reinterpret_cast<fdk::StackLayer*>(p + 1);
  for (int64_t i = 0; i < num_layers; ++i) {
    const Tensor* w = weights.data() + i * per_layer;
    const int64_t* m = linear_meta.data() + i * kMetaPerLayer;
    fdk::StackLayer& l = layers[i];
    l.input_norm = f32_ptr(w[0], hidden, "input_layernorm", i);
    constexpr int64_t L = kPerLinear;
    l.qkv = stack_linear(w + 1, m, hidden, "qkv_proj", i);
    l.o_proj = stack_linear(w + 1 + L, m + 4, q_size, "o_proj", i);
    l.post_norm = f32_ptr(w[1 + 2 * L], hidden, "post_attention_layernorm", i);
    l.gate_up = stack_linear(w + 2 + 2 * L, m + 8, hidden, "gate_up_proj", i);
    l.down = stack_linear(w + 2 + 3 * L, m + 12, p->intermediate, "down_proj", i);
    PD_CHECK(l.qkv.n == q_size + 2 * kv_size && l.o_proj.n == hidden && l.gate_up.n == 2 * p->intermediate &&
                 l.down.n == hidden,
             "decoder_stack: layer ", i, " linear widths do not fit the stack's dimensions");
    l.q_norm = qk_norm ? f32_ptr(w[kPerLayer], head_dim, "q_norm", i) : nullptr;
    l.k_norm = qk_norm ? f32_ptr(w[kPerLayer + 1], head_dim, "k_norm", i) : nullptr;
  }
  return {plan};
}

std::vector<Tensor> DecoderStackBind(const Tensor& plan_in, const std::vector<Tensor>& kv_caches) {
  const WeightPlan* p = read_plan<WeightPlan, fdk::StackLayer>(plan_in, kWeightMagic, "plan");
  const int64_t n = p->num_layers, per_cache = (int64_t)kv_caches.size() / n;
  PD_CHECK((per_cache == 2 || per_cache == 4) && (int64_t)kv_caches.size() == per_cache * n,
           "decoder_stack: KV caches must be 2 (fp32 / bf16) or 4 (C8) tensors per layer, for ", n, " layers");
  const std::vector<int64_t> shape = kv_caches[0].shape();
  PD_CHECK(shape.size() == 4 && shape[0] > 0 && shape[1] == p->num_kv_heads && shape[2] > 0 &&
               shape[3] == p->head_dim,
           "decoder_stack: caches must be [nb, num_kv_heads, bs, head_dim]");
  Tensor plan = plan_tensor(sizeof(CachePlan) + n * sizeof(fdk::StackCache), plan_in.place());
  CachePlan* c = reinterpret_cast<CachePlan*>(plan.data<int64_t>());
  *c = CachePlan{kCacheMagic, n, shape[1], shape[3], shape[0], shape[2]};
  fdk::StackCache* caches = reinterpret_cast<fdk::StackCache*>(c + 1);
  const paddle::DataType dt = kv_caches[0].dtype();
  for (int64_t i = 0; i < n; ++i)
    caches[i] = stack_cache(kv_caches.data() + i * per_cache, per_cache == 4, dt, shape, i);
  return {plan};
}

std::vector<Tensor> DecoderStack(const Tensor& x_in, const Tensor& positions, const Tensor& slots_in,
                                 const Tensor& qsl_in, const Tensor& seq_lens_in, const Tensor& bt_in,
                                 const Tensor& prompt_rows, const Tensor& plan, const Tensor& cache_plan,
                                 const Tensor& out_rows, const Tensor& out_qsl, const Tensor& out_seq_lens,
                                 const Tensor& out_bt, const Tensor& out_prompt_rows, bool greedy) {
  const WeightPlan* p = read_plan<WeightPlan, fdk::StackLayer>(plan, kWeightMagic, "plan");
  const CachePlan* c = read_plan<CachePlan, fdk::StackCache>(cache_plan, kCacheMagic, "cache plan");
  check_plans(*p, *c, greedy);
  Tensor x;
  fdk::Scratch embedded;
  const float* xp = nullptr;
  int64_t t = 0;
  if (x_in.dtype() == paddle::DataType::INT64 && x_in.shape().size() == 1) {
    const std::vector<int64_t> ids = as_i64(x_in, "token ids");
    t = (int64_t)ids.size();
    xp = embed_ids(*p, ids, embedded);
  } else {
    PD_CHECK(x_in.is_cpu() && x_in.dtype() == paddle::DataType::FLOAT32 && x_in.shape().size() == 2 &&
                 x_in.shape()[1] == p->hidden,
             "decoder_stack: x must be a float32 [T, hidden_size] CPU tensor or int64 [T] token ids");
    x = contig(x_in);
    t = x.shape()[0];
    xp = x.data<float>();
  }

  const StepRows m{as_i64(positions, "positions"), as_i64(slots_in, "slot_mapping"),
                   as_i64(qsl_in, "query_start_loc"), as_i64(seq_lens_in, "seq_lens"), as_i64(bt_in, "block_tables")};
  fdk::StackArgs a = step_args(*p, *c, t, m);
  if (prompt_rows.numel() > 0) {
    PD_CHECK(prompt_rows.dtype() == paddle::DataType::UINT8 && prompt_rows.is_contiguous() &&
                 prompt_rows.numel() == t,
             "decoder_stack: prompt_rows must be a contiguous uint8 tensor with one entry per token");
    a.prompt_rows = prompt_rows.data<uint8_t>();
  }

  OutRows o;
  if (out_rows.numel() > 0 || out_qsl.numel() > 0) {
    o = {as_i64(out_rows, "out_rows"), as_i64(out_qsl, "out query_start_loc"), as_i64(out_seq_lens, "out seq_lens"),
         as_i64(out_bt, "out block_tables")};
    set_out_rows(a, t, c->num_blocks, o, out_prompt_rows);
  }

  const int64_t out_rows_n = a.out_query_start_loc ? a.num_out : t;
  Tensor out = paddle::empty({out_rows_n, p->hidden}, paddle::DataType::FLOAT32, plan.place());
  Tensor tokens = paddle::empty({greedy ? out_rows_n : 0}, paddle::DataType::INT64, plan.place());
  if (greedy)
    fdk::decoder_stack_greedy(a, p->layers(), c->caches(), p->num_layers, xp, out.data<float>(),
                              p->head, tokens.data<int64_t>());
  else
    fdk::decoder_stack(a, p->layers(), c->caches(), p->num_layers, xp, out.data<float>());
  return {out, tokens};
}

// The greedy step of fd_decoder_stack on token ids through ctypes (fd_kernels/native/stack_step.py): a
// decode step then skips Paddle's op dispatch both ways. The same checks and kernel as the op with greedy,
// token ids, no prompt rows and no out rows. The plans are the int64 words of the plan tensors; the metadata
// as the engine keeps it: int64 ids, positions, slot_mapping [t]; int32 query_start_loc [num_seqs + 1],
// seq_lens [num_seqs], block_tables [num_seqs, max_blocks]. Writes hidden [t, hidden] and tokens [t] (-1 for a
// row with a NaN logit). Returns 0, or 1 with the error's message in `error`: no exception crosses the C ABI.
extern "C" int32_t fd_decoder_stack_greedy_host(const int64_t* plan, int64_t plan_words, const int64_t* cache_plan,
                                               int64_t cache_words, const int64_t* ids, const int64_t* positions,
                                               const int64_t* slots, int64_t t, const int32_t* qsl,
                                               const int32_t* seq_lens, int64_t num_seqs, const int32_t* block_tables,
                                               int64_t max_blocks, float* hidden, int64_t* tokens, char* error,
                                               int64_t error_size) {
  try {
    PD_CHECK(t >= 0 && num_seqs >= 0 && max_blocks >= 0 && (t == 0 || (ids && positions && slots && hidden && tokens)),
             "decoder_stack: bad step arrays");
    const WeightPlan* p = read_plan<WeightPlan, fdk::StackLayer>(plan, plan_words, kWeightMagic, "plan");
    const CachePlan* c = read_plan<CachePlan, fdk::StackCache>(cache_plan, cache_words, kCacheMagic, "cache plan");
    check_plans(*p, *c, true);
    fdk::Scratch embedded;
    const float* xp = embed_ids(*p, std::vector<int64_t>(ids, ids + t), embedded);
    const StepRows m{{positions, positions + t},
                     {slots, slots + t},
                     {qsl, qsl + num_seqs + 1},
                     {seq_lens, seq_lens + num_seqs},
                     {block_tables, block_tables + num_seqs * max_blocks}};
    const fdk::StackArgs a = step_args(*p, *c, t, m);
    fdk::decoder_stack_greedy(a, p->layers(), c->caches(), p->num_layers, xp, hidden, p->head, tokens);
    return 0;
  } catch (const std::exception& e) {
    std::snprintf(error, (size_t)error_size, "%s", e.what());
  } catch (...) {
    std::snprintf(error, (size_t)error_size, "decoder_stack: unknown error");
  }
  return 1;
}

PD_BUILD_OP(fd_decoder_stack_plan)
    .Inputs({"FinalNorm", "CosSin", "Embedding", paddle::Vec("Weights")})
    .Outputs({"Plan"})
    .Attrs({"linear_meta: std::vector<int64_t>", "hidden: int64_t", "num_heads: int64_t", "num_kv_heads: int64_t",
            "head_dim: int64_t", "qk_norm: bool", "eps: float", "scale: float", "embed_rows: int64_t",
            "embed_kind: int64_t", "has_head: bool"})
    .SetKernelFn(PD_KERNEL(DecoderStackPlan));

PD_BUILD_OP(fd_decoder_stack_bind)
    .Inputs({"Plan", paddle::Vec("KVCaches")})
    .Outputs({"CachePlan"})
    .SetKernelFn(PD_KERNEL(DecoderStackBind));

PD_BUILD_OP(fd_decoder_stack)
    .Inputs({"X", "Positions", "Slots", "QueryStartLoc", "SeqLens", "BlockTables", "PromptRows", "Plan",
             "CachePlan", "OutRows", "OutQueryStartLoc", "OutSeqLens", "OutBlockTables", "OutPromptRows"})
    .Outputs({"Out", "Tokens"})
    .Attrs({"greedy: bool"})
    .SetKernelFn(PD_KERNEL(DecoderStack));
