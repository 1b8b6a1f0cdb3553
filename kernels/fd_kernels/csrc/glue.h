// Helpers shared by the Paddle glue files (ops.cc, ops_c8.cc): input checks and metadata conversion.
#pragma once
#include <cstring>
#include <vector>

#include "kernels.h"
#include "paddle/extension.h"

namespace fdglue {

using paddle::Tensor;

inline Tensor contig(const Tensor& x) { return x.is_contiguous() ? x : x.contiguous(); }

inline void check_dtype(const Tensor& x, paddle::DataType dt, const char* name, const char* what) {
  PD_CHECK(x.is_cpu(), name, " must be a CPU tensor");
  PD_CHECK(x.dtype() == dt, name, " must be ", what);
}

inline void check_f32(const Tensor& x, const char* name) {
  check_dtype(x, paddle::DataType::FLOAT32, name, "float32");
}

// The dtype of a packed linear weight of `kind` (kernels.h).
inline paddle::DataType packed_dtype(int64_t kind) {
  return kind == fdk::kF32 ? paddle::DataType::FLOAT32
         : kind == fdk::kS8 ? paddle::DataType::INT8
                            : paddle::DataType::UINT8;
}

// An fp32 or bf16 KV cache pair (k_cache and v_cache of one dtype): the KvKind the kernels read.
inline int kv_cache_kind(const Tensor& kc, const Tensor& vc) {
  PD_CHECK(kc.is_cpu() && vc.is_cpu(), "k_cache and v_cache must be CPU tensors");
  const auto dt = kc.dtype();
  PD_CHECK(dt == paddle::DataType::FLOAT32 || dt == paddle::DataType::BFLOAT16,
           "k_cache must be float32 or bfloat16");
  PD_CHECK(vc.dtype() == dt, "v_cache must have k_cache's dtype");
  return dt == paddle::DataType::BFLOAT16 ? fdk::kKvBF16 : fdk::kKvF32;
}

// Integer metadata as int64, whatever its stored width (the runner may pass int32).
inline std::vector<int64_t> as_i64(const Tensor& x, const char* name) {
  PD_CHECK(x.is_cpu(), name, " must be a CPU tensor");
  const Tensor c = contig(x);
  std::vector<int64_t> out(c.numel());
  if (c.dtype() == paddle::DataType::INT64) {
    std::memcpy(out.data(), c.data<int64_t>(), out.size() * sizeof(int64_t));
  } else {
    PD_CHECK(c.dtype() == paddle::DataType::INT32, name, " must be int32 or int64");
    const int32_t* p = c.data<int32_t>();
    for (size_t i = 0; i < out.size(); ++i) out[i] = p[i];
  }
  return out;
}

// Paged-attention metadata, converted and checked against q [T, nh, hd] and caches [nb, nkv, bs, hd]:
// every sequence's queries fit its context, its block table covers it, and its block ids exist.
struct PagedMeta {
  std::vector<int64_t> qsl, lens, bt;
  int64_t nseq, max_blocks, nh, hd, nkv, bs;
};

inline PagedMeta paged_meta(const Tensor& q, const std::vector<int64_t>& cs, const Tensor& qsl_in,
                            const Tensor& seq_lens_in, const Tensor& bt_in) {
  PD_CHECK(q.shape().size() == 3, "paged_attention: q must be [T, nh, hd]");
  const auto qs = q.shape();
  PagedMeta m;
  m.nh = qs[1], m.hd = qs[2], m.nkv = cs[1], m.bs = cs[2];
  PD_CHECK(cs[3] == m.hd && m.hd <= 512, "paged_attention: head_dim mismatch (or > 512)");
  PD_CHECK(m.nkv > 0 && m.nh % m.nkv == 0, "paged_attention: num_heads must be a multiple of num_kv_heads");
  m.qsl = as_i64(qsl_in, "query_start_loc");
  m.lens = as_i64(seq_lens_in, "seq_lens");
  m.bt = as_i64(bt_in, "block_tables");
  m.nseq = (int64_t)m.lens.size();
  PD_CHECK((int64_t)m.qsl.size() == m.nseq + 1 && m.qsl[m.nseq] == qs[0],
           "paged_attention: query_start_loc mismatch");
  m.max_blocks = m.nseq ? (int64_t)m.bt.size() / m.nseq : 0;
  for (int64_t b = 0; b < m.nseq; ++b) {
    const int64_t nq = m.qsl[b + 1] - m.qsl[b];
    PD_CHECK(nq >= 0 && nq <= m.lens[b], "paged_attention: sequence ", b, " has more queries than context");
    PD_CHECK(m.lens[b] <= m.max_blocks * m.bs, "paged_attention: block table too short for sequence ", b);
    for (int64_t j = 0; j < (m.lens[b] + m.bs - 1) / m.bs; ++j) {
      const int64_t id = m.bt[b * m.max_blocks + j];
      PD_CHECK(id >= 0 && id < cs[0], "paged_attention: bad block id");
    }
  }
  return m;
}

// AttentionMetadata.prompt_rows as the kernels take it: uint8 [t] or empty (nullptr).
inline const uint8_t* prompt_rows_of(const Tensor& rows, int64_t t, const char* op) {
  if (rows.numel() == 0) return nullptr;
  PD_CHECK(rows.is_cpu() && rows.dtype() == paddle::DataType::UINT8 && rows.is_contiguous() && rows.numel() == t,
           op, ": prompt_rows must be a contiguous uint8 tensor with one entry per token");
  return rows.data<uint8_t>();
}

// A linear's bf16 tiles (fdk::GemmArgs::tiles): an empty tensor for none, else exactly the tiles of its
// kind and shape (int16 holding bf16 bits), which the kernels then read in place of the weight.
inline const uint16_t* tiles_ptr(const Tensor& tiles, int64_t kind, int64_t n, int64_t k, const char* op) {
  if (tiles.numel() == 0) return nullptr;
  PD_CHECK(kind != fdk::kF32 && tiles.is_cpu() && tiles.is_contiguous() && tiles.dtype() == paddle::DataType::INT16 &&
               tiles.numel() == fdk::amx::tiles_elems(n, k),
           op, ": tiles do not match the weight");
  return reinterpret_cast<const uint16_t*>(tiles.data<int16_t>());
}

}  // namespace fdglue
