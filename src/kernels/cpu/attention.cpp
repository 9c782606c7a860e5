// Causal attention forward and backward with materialised probabilities (see attention.hpp):
// the kernel classes, and the bf16 computation on oneDNN products below (fp32 runs
// attention_tiles.cpp, grouped kv heads included; the bf16 path refuses them).
//
// Subtle point: every operand is a strided 4-D view {B, NH, rows, cols} of a tensor laid out
// for the rest of the model. q of head h is at qkv + h*HS with strides {T*3C, HS, 3C, 1};
// k^T is the same bytes at offset C with the last two strides swapped; y and the three parts
// of dqkv are written in place of their (B, T, ...) layouts. No transpose or copy is ever
// made, and the backward computes dV = probs^T dy before the softmax backward turns dprobs
// into dscores in place.
//
// The causal mask makes the blocks above the diagonal of every T x T product zero, so the
// sequence is cut into a few blocks: query block i multiplies only against keys [0, end_i),
// key block j only receives gradient from queries [begin_j, T). Entries of probs or dprobs
// above the diagonal that no product writes are set to 0 by the softmax passes, which visit
// every row in full.
#include "kernels/cpu/attention.hpp"

#include <algorithm>

#include "core/error.hpp"
#include <omp.h>

#include "kernels/cpu/attention_tiles.hpp"
#include "kernels/cpu/matmul.hpp"
#include "kernels/cpu/parallel.hpp"
#include "kernels/cpu/vec_math.hpp"

namespace memfit {
namespace {

using dt = dnnl::memory::data_type;

// Strided views of the tensors the products read and write. rows/cols are the extents of
// the (sub)matrix taken; the pointer offset of a block is added when binding. `io` is the
// type of qkv, y, probs and their gradients (bf16).
struct Views {
  int64_t B, NH, T, HS, C;
  dt io;
  explicit Views(const AttentionShape& s)
      : B(s.batch), NH(s.heads), T(s.seq), HS(s.head_dim), C(s.channels()), io(dnnl_type(s.dtype)) {}
  // `rows` positions of q, k or v (a part of qkv or dqkv) as {B, NH, rows, HS}.
  DnnlOperand part(int64_t rows) const { return {{B, NH, rows, HS}, {T * 3 * C, HS, 3 * C, 1}, io}; }
  // the same part transposed to {B, NH, HS, cols}.
  DnnlOperand part_t(int64_t cols) const { return {{B, NH, HS, cols}, {T * 3 * C, HS, 1, 3 * C}, io}; }
  // `rows` positions of y or dy (B, T, C) as {B, NH, rows, HS}.
  DnnlOperand out(int64_t rows) const { return {{B, NH, rows, HS}, {T * C, HS, C, 1}, io}; }
  // A rows x cols block of a (B, NH, T, T) tensor, or of its transpose: probs in `io`.
  DnnlOperand square(int64_t rows, int64_t cols) const { return square_as(rows, cols, io, T); }
  DnnlOperand square_t(int64_t rows, int64_t cols) const { return square_t_as(rows, cols, io, T); }
  // The same with an explicit type and row stride: fp32 dprobs (stride T), and the bf16
  // dscores written over the first half of each fp32 dprobs row (stride 2T bf16 elements).
  DnnlOperand square_as(int64_t rows, int64_t cols, dt type, int64_t row) const {
    return {{B, NH, rows, cols}, {NH * T * row, T * row, row, 1}, type};
  }
  DnnlOperand square_t_as(int64_t rows, int64_t cols, dt type, int64_t row) const {
    return {{B, NH, rows, cols}, {NH * T * row, T * row, 1, row}, type};
  }
  DnnlOperand dprobs(int64_t rows, int64_t cols) const { return square_as(rows, cols, dt::f32, T); }
  DnnlOperand dscores(int64_t rows, int64_t cols) const { return square_as(rows, cols, io, 2 * T); }
  DnnlOperand dscores_t(int64_t rows, int64_t cols) const { return square_t_as(rows, cols, io, 2 * T); }
  // The forward's fp32 scores of one query block of at most bm rows, {B, NH, rows, cols}.
  DnnlOperand scores_block(int64_t rows, int64_t cols, int64_t bm) const {
    return {{B, NH, rows, cols}, {NH * bm * T, bm * T, T, 1}, dt::f32};
  }
};
constexpr int64_t kIoBytes = sizeof(bf16_t);

// Byte arithmetic on the bf16 operands (w = kIoBytes).
const void* advance(const void* p, int64_t elements, int64_t element_bytes) {
  return static_cast<const char*>(p) + elements * element_bytes;
}
void* advance(void* p, int64_t elements, int64_t element_bytes) {
  return static_cast<char*>(p) + elements * element_bytes;
}

uint64_t scores_block_bytes(const AttentionShape& s) {
  return (uint64_t(s.batch * s.heads * s.max_block() * s.seq) * sizeof(float) + 63) / 64 * 64;
}

DnnlMatmulSpec spec(DnnlOperand src, DnnlOperand wei, DnnlOperand dst, float scale, bool accumulate) {
  DnnlMatmulSpec s;
  s.src = std::move(src);
  s.wei = std::move(wei);
  s.dst = std::move(dst);
  s.scale = scale;
  s.accumulate = accumulate;
  return s;
}

// Block i covers positions [b, e) of T. Query-block products see keys [0, e); key-block
// products see queries [b, T).
struct Block {
  int64_t b, e;
  int64_t size() const { return e - b; }
};
Block block(const AttentionShape& s, int64_t i) { return Block{s.block_begin(i), s.block_begin(i + 1)}; }

DnnlMatmulSpec scores_spec(const Views& v, Block q, float scale, int64_t bm) {
  return spec(v.part(q.size()), v.part_t(q.e), v.scores_block(q.size(), q.e, bm), scale, false);
}
DnnlMatmulSpec out_spec(const Views& v, Block q, bool acc) {
  return spec(v.square(q.size(), q.e), v.part(q.e), v.out(q.size()), 1.0f, acc);
}
DnnlMatmulSpec dprobs_spec(const Views& v, Block q) {
  return spec(v.out(q.size()), v.part_t(q.e), v.dprobs(q.size(), q.e), 1.0f, false);
}
DnnlMatmulSpec dq_spec(const Views& v, Block q, float scale, bool acc) {
  return spec(v.dscores(q.size(), q.e), v.part(q.e), v.part(q.size()), scale, acc);
}
DnnlMatmulSpec dv_spec(const Views& v, Block k, bool acc) {
  return spec(v.square_t(k.size(), v.T - k.b), v.out(v.T - k.b), v.part(k.size()), 1.0f, acc);
}
DnnlMatmulSpec dk_spec(const Views& v, Block k, float scale, bool acc) {
  return spec(v.dscores_t(k.size(), v.T - k.b), v.part(v.T - k.b), v.part(k.size()), scale, acc);
}

template <class Visit>
void for_each_variant(WriteVariants modes, Visit visit) {
  if (modes.overwrite) visit(0);
  if (modes.accumulate) visit(1);
}

}  // namespace

AttentionShape AttentionShape::of(const AttentionAttrs& a) {
  MEMFIT_CHECK(a.batch > 0 && a.seq > 0 && a.heads > 0 && a.head_dim > 0, "kernels",
               "attention with empty shape B={} T={} NH={} HS={}", a.batch, a.seq, a.heads, a.head_dim);
  MEMFIT_CHECK(a.kv_heads >= 0 && a.kv_heads <= a.heads && (a.kv_heads == 0 || a.heads % a.kv_heads == 0), "kernels",
               "attention with {} kv heads for {} query heads: the query heads must be a multiple of the kv heads",
               a.kv_heads, a.heads);
  return AttentionShape{a.batch, a.seq, a.heads, a.head_dim, a.scale, DType::f32, a.kv_heads};
}

namespace {
// The oneDNN descriptors below read k and v of head h at the same head index as q; a grouped
// shape would need a broadcast batch dimension in the forward and a sum over the group in
// the backward's dk, dv products, which this path does not have.
void require_no_groups_bf16(const AttentionShape& s) {
  MEMFIT_CHECK(s.dtype != DType::bf16 || s.kv() == s.heads, "kernels",
               "no bf16 kernel for plain attention with {} kv heads for {} query heads: use --attention flash",
               s.kv(), s.heads);
}
}  // namespace

int64_t AttentionShape::max_block() const {
  int64_t m = 0;
  for (int64_t i = 0; i < blocks(); ++i) m = std::max(m, block_begin(i + 1) - block_begin(i));
  return m;
}

// With b blocks the products compute (b + 1) / 2b of the full T x T work. Measured on the fp32
// form these products had before attention_tiles.cpp, B=4, T=256, NH=12, HS=64 (2 cores): 1 block
// 4.3 + 7.6 ms, 2 blocks 3.6 + 6.1, 4 blocks 3.4 + 5.5, 8 blocks of 32 no better; so blocks of
// at least 64 positions, at most 8.
int64_t AttentionShape::blocks() const { return std::clamp<int64_t>(seq / kAttentionBlockMin, 1, kAttentionMaxBlocks); }

void attention_softmax_forward_bf16(const float* scores, bf16_t* probs, int64_t rows, int64_t seq, int64_t first_pos,
                                    int64_t rows_per_head, int64_t scores_head_stride) {
  parallel_for(rows, kParallelGrain / seq, [=](int64_t first, int64_t last) {
    for (int64_t r = first; r < last; ++r) {
      // Row r is position first_pos + r % rows_per_head of head r / rows_per_head.
      const int64_t head = r / rows_per_head, t = first_pos + r % rows_per_head;
      const float* x = scores + head * scores_head_stride + (r % rows_per_head) * seq;
      bf16_t* p = probs + (head * seq + t) * seq;
      float mx = x[0];
#pragma omp simd reduction(max : mx)
      for (int64_t s = 0; s <= t; ++s) mx = x[s] > mx ? x[s] : mx;
      float sum = 0;
#pragma omp simd reduction(+ : sum)
      for (int64_t s = 0; s <= t; ++s) sum += softmax_exp(x[s] - mx);
      const float inv = 1.0f / sum;
#pragma omp simd
      for (int64_t s = 0; s <= t; ++s) p[s] = narrow<bf16_t>(softmax_exp(x[s] - mx) * inv);
      std::fill(p + t + 1, p + seq, bf16_t{0});
    }
  });
}

void attention_softmax_backward_bf16(const bf16_t* probs, float* dprobs, int64_t rows, int64_t seq) {
  constexpr int64_t kChunk = 256;
  parallel_for(rows, kParallelGrain / seq, [=](int64_t first, int64_t last) {
    for (int64_t r = first; r < last; ++r) {
      const int64_t t = r % seq;
      const bf16_t* p = probs + r * seq;
      float* d = dprobs + r * seq;
      bf16_t* out = reinterpret_cast<bf16_t*>(d);  // the first half of the row's bytes
      float dot = 0;
#pragma omp simd reduction(+ : dot)
      for (int64_t s = 0; s <= t; ++s) dot += widen(p[s]) * d[s];
      // In chunks, each fully read before any of it is written: bf16 element s lands on the
      // bytes of fp32 element s/2, which an earlier chunk (or this one) has already consumed.
      for (int64_t c0 = 0; c0 <= t; c0 += kChunk) {
        const int64_t n = std::min(kChunk, t + 1 - c0);
        float tmp[kChunk];
#pragma omp simd
        for (int64_t s = 0; s < n; ++s) tmp[s] = widen(p[c0 + s]) * (d[c0 + s] - dot);
#pragma omp simd
        for (int64_t s = 0; s < n; ++s) out[c0 + s] = narrow<bf16_t>(tmp[s]);
      }
      std::fill(out + t + 1, out + seq, bf16_t{0});
    }
  });
}

AttentionForwardKernel::AttentionForwardKernel(const DnnlEnv& env, const AttentionShape& shape,
                                               WriteVariants y_modes)
    : shape_(shape) {
  MEMFIT_CHECK(shape.dtype == DType::f32 || shape.dtype == DType::bf16, "kernels", "no CPU attention over {} tensors",
               dtype_name(shape.dtype));
  require_no_groups_bf16(shape);
  if (shape.dtype == DType::f32) {
    threads_ = omp_get_max_threads();
    return;
  }
  const Views v(shape);
  for (int64_t i = 0; i < shape.blocks(); ++i) {
    const Block q = block(shape, i);
    scores_.emplace_back(env, scores_spec(v, q, shape.scale, shape.max_block()));
    for_each_variant(y_modes, [&](int acc) { out_[acc].emplace_back(env, out_spec(v, q, acc)); });
  }
}

uint64_t AttentionForwardKernel::scratch_bytes(const DnnlEnv& env, const AttentionShape& shape,
                                               WriteVariants y_modes) {
  if (shape.dtype == DType::f32) return attention_tiles_scratch_bytes(shape, omp_get_max_threads());
  require_no_groups_bf16(shape);
  const Views v(shape);
  uint64_t bytes = 0;
  for (int64_t i = 0; i < shape.blocks(); ++i) {
    const Block q = block(shape, i);
    bytes = std::max(bytes, DnnlMatmul::scratch_bytes(env, scores_spec(v, q, shape.scale, shape.max_block())));
    for_each_variant(y_modes, [&](int acc) {
      bytes = std::max(bytes, DnnlMatmul::scratch_bytes(env, out_spec(v, q, acc)));
    });
  }
  return scores_block_bytes(shape) + bytes;
}

void AttentionForwardKernel::bind(const void* qkv, void* y, void* probs, void* scratch) {
  qkv_ = qkv, y_ = y, probs_ = probs, scratch_ = scratch;
  has_y_ = y != nullptr;
  if (shape_.dtype == DType::f32) return;
  const int64_t C = shape_.channels(), T = shape_.seq, w = kIoBytes;
  scores_block_ = static_cast<float*>(scratch);
  scratch = static_cast<char*>(scratch) + scores_block_bytes(shape_);
  for (int64_t i = 0; i < shape_.blocks(); ++i) {
    const Block q = block(shape_, i);
    scores_[size_t(i)].bind(advance(qkv, q.b * 3 * C, w), advance(qkv, C, w), nullptr, scores_block_, scratch);
    for (auto& out : out_)
      if (!out.empty() && y)
        out[size_t(i)].bind(advance(probs, q.b * T, w), advance(qkv, 2 * C, w), nullptr, advance(y, q.b * C, w),
                            scratch);
  }
}

void AttentionForwardKernel::run(bool acc_y) const {
  if (shape_.dtype == DType::f32) {
    attention_forward_tiles(shape_, static_cast<const float*>(qkv_), static_cast<float*>(y_),
                            static_cast<float*>(probs_), acc_y, scratch_, threads_);
    return;
  }
  // Without y (a recomputation that only needs the probabilities) the products with v are skipped.
  const std::vector<DnnlMatmul>* out = nullptr;
  if (has_y_) {
    out = &out_[acc_y ? 1 : 0];
    MEMFIT_ASSERT(!out->empty(), "attention prepared without its {} variant", acc_y ? "accumulate" : "overwrite");
  }
  const int64_t BH = shape_.batch * shape_.heads, T = shape_.seq;
  // Block by block, the fp32 scores of a block live only in the scratch.
  for (int64_t i = 0; i < shape_.blocks(); ++i) {
    const Block q = block(shape_, i);
    scores_[size_t(i)].execute();
    attention_softmax_forward_bf16(scores_block_, static_cast<bf16_t*>(probs_), BH * q.size(), T, q.b, q.size(),
                                   shape_.max_block() * T);
    if (out) (*out)[size_t(i)].execute();
  }
}

AttentionBackwardKernel::AttentionBackwardKernel(const DnnlEnv& env, const AttentionShape& shape,
                                                 WriteVariants dqkv_modes)
    : shape_(shape) {
  MEMFIT_CHECK(shape.dtype == DType::f32 || shape.dtype == DType::bf16, "kernels", "no CPU attention over {} tensors",
               dtype_name(shape.dtype));
  require_no_groups_bf16(shape);
  if (shape.dtype == DType::f32) {
    threads_ = omp_get_max_threads();
    return;
  }
  const Views v(shape);
  for (int64_t i = 0; i < shape.blocks(); ++i) {
    const Block blk = block(shape, i);
    dprobs_mm_.emplace_back(env, dprobs_spec(v, blk));
    for_each_variant(dqkv_modes, [&](int acc) {
      dq_[acc].emplace_back(env, dq_spec(v, blk, shape.scale, acc));
      dk_[acc].emplace_back(env, dk_spec(v, blk, shape.scale, acc));
      dv_[acc].emplace_back(env, dv_spec(v, blk, acc));
    });
  }
}

uint64_t AttentionBackwardKernel::scratch_bytes(const DnnlEnv& env, const AttentionShape& shape,
                                                WriteVariants dqkv_modes) {
  if (shape.dtype == DType::f32) return attention_tiles_scratch_bytes(shape, omp_get_max_threads());
  require_no_groups_bf16(shape);
  const Views v(shape);
  uint64_t bytes = 0;
  for (int64_t i = 0; i < shape.blocks(); ++i) {
    const Block blk = block(shape, i);
    bytes = std::max(bytes, DnnlMatmul::scratch_bytes(env, dprobs_spec(v, blk)));
    for_each_variant(dqkv_modes, [&](int acc) {
      bytes = std::max({bytes, DnnlMatmul::scratch_bytes(env, dq_spec(v, blk, shape.scale, acc)),
                        DnnlMatmul::scratch_bytes(env, dk_spec(v, blk, shape.scale, acc)),
                        DnnlMatmul::scratch_bytes(env, dv_spec(v, blk, acc))});
    });
  }
  return bytes;
}

void AttentionBackwardKernel::bind(const void* dy, const void* qkv, const void* probs, void* dqkv, float* dprobs,
                                   void* scratch) {
  dy_ = dy, qkv_ = qkv, probs_ = probs, dqkv_ = dqkv, dprobs_ = dprobs, scratch_ = scratch;
  if (shape_.dtype == DType::f32) return;
  const int64_t C = shape_.channels(), T = shape_.seq, w = kIoBytes;
  // dscores are bf16 over the first half of each fp32 dprobs row: rows of 2T elements.
  const int64_t ds_row = 2 * T;
  for (int64_t i = 0; i < shape_.blocks(); ++i) {
    const Block blk = block(shape_, i);
    // As a query block: rows [b, e) of dprobs / dscores against keys [0, e).
    dprobs_mm_[size_t(i)].bind(advance(dy, blk.b * C, w), advance(qkv, 2 * C, w), nullptr, dprobs + blk.b * T,
                               scratch);
    // As a key block: the transposed [b, T) x [b, e) block of probs / dscores starts at (b, b).
    for (int acc = 0; acc < 2; ++acc) {
      if (dq_[acc].empty()) continue;
      void* ds_rows = advance(static_cast<void*>(dprobs), blk.b * ds_row, w);
      void* ds_corner = advance(static_cast<void*>(dprobs), blk.b * ds_row + blk.b, w);
      dq_[acc][size_t(i)].bind(ds_rows, advance(qkv, C, w), nullptr, advance(dqkv, blk.b * 3 * C, w), scratch);
      dv_[acc][size_t(i)].bind(advance(probs, blk.b * T + blk.b, w), advance(dy, blk.b * C, w), nullptr,
                               advance(dqkv, 2 * C + blk.b * 3 * C, w), scratch);
      dk_[acc][size_t(i)].bind(ds_corner, advance(qkv, blk.b * 3 * C, w), nullptr,
                               advance(dqkv, C + blk.b * 3 * C, w), scratch);
    }
  }
}

void AttentionBackwardKernel::run(bool acc_dqkv) const {
  if (shape_.dtype == DType::f32) {
    attention_backward_tiles(shape_, static_cast<const float*>(dy_), static_cast<const float*>(qkv_),
                             static_cast<const float*>(probs_), static_cast<float*>(dqkv_), dprobs_, acc_dqkv,
                             scratch_, threads_);
    return;
  }
  const int acc = acc_dqkv ? 1 : 0;
  MEMFIT_ASSERT(!dv_[acc].empty(), "attention backward prepared without its {} variant",
                acc_dqkv ? "accumulate" : "overwrite");
  const int64_t rows = shape_.batch * shape_.heads * shape_.seq;
  for (const DnnlMatmul& mm : dv_[acc]) mm.execute();
  for (const DnnlMatmul& mm : dprobs_mm_) mm.execute();
  attention_softmax_backward_bf16(static_cast<const bf16_t*>(probs_), dprobs_, rows, shape_.seq);
  for (const DnnlMatmul& mm : dq_[acc]) mm.execute();
  for (const DnnlMatmul& mm : dk_[acc]) mm.execute();
}

}  // namespace memfit
