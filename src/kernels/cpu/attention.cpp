// Causal attention forward and backward with materialised probabilities (see attention.hpp).
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
#include "kernels/cpu/parallel.hpp"
#include "kernels/cpu/vec_math.hpp"

namespace memfit {
namespace {

// Strided views of the tensors the products read and write. rows/cols are the extents of
// the (sub)matrix taken; the pointer offset of a block is added when binding.
struct Views {
  int64_t B, NH, T, HS, C;
  explicit Views(const AttentionShape& s) : B(s.batch), NH(s.heads), T(s.seq), HS(s.head_dim), C(s.channels()) {}
  // `rows` positions of q, k or v (a part of qkv or dqkv) as {B, NH, rows, HS}.
  DnnlOperand part(int64_t rows) const { return {{B, NH, rows, HS}, {T * 3 * C, HS, 3 * C, 1}}; }
  // the same part transposed to {B, NH, HS, cols}.
  DnnlOperand part_t(int64_t cols) const { return {{B, NH, HS, cols}, {T * 3 * C, HS, 1, 3 * C}}; }
  // `rows` positions of y or dy (B, T, C) as {B, NH, rows, HS}.
  DnnlOperand out(int64_t rows) const { return {{B, NH, rows, HS}, {T * C, HS, C, 1}}; }
  // A rows x cols block of a (B, NH, T, T) tensor, or of its transpose.
  DnnlOperand square(int64_t rows, int64_t cols) const { return {{B, NH, rows, cols}, {NH * T * T, T * T, T, 1}}; }
  DnnlOperand square_t(int64_t rows, int64_t cols) const { return {{B, NH, rows, cols}, {NH * T * T, T * T, 1, T}}; }
};

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

DnnlMatmulSpec scores_spec(const Views& v, Block q, float scale) {
  return spec(v.part(q.size()), v.part_t(q.e), v.square(q.size(), q.e), scale, false);
}
DnnlMatmulSpec out_spec(const Views& v, Block q, bool acc) {
  return spec(v.square(q.size(), q.e), v.part(q.e), v.out(q.size()), 1.0f, acc);
}
DnnlMatmulSpec dprobs_spec(const Views& v, Block q) {
  return spec(v.out(q.size()), v.part_t(q.e), v.square(q.size(), q.e), 1.0f, false);
}
DnnlMatmulSpec dq_spec(const Views& v, Block q, float scale, bool acc) {
  return spec(v.square(q.size(), q.e), v.part(q.e), v.part(q.size()), scale, acc);
}
DnnlMatmulSpec dv_spec(const Views& v, Block k, bool acc) {
  return spec(v.square_t(k.size(), v.T - k.b), v.out(v.T - k.b), v.part(k.size()), 1.0f, acc);
}
DnnlMatmulSpec dk_spec(const Views& v, Block k, float scale, bool acc) {
  return spec(v.square_t(k.size(), v.T - k.b), v.part(v.T - k.b), v.part(k.size()), scale, acc);
}

template <class Visit>
void for_each_variant(WriteVariants modes, Visit visit) {
  if (modes.overwrite) visit(0);
  if (modes.accumulate) visit(1);
}

}  // namespace

AttentionShape AttentionShape::of(const AttentionAttrs& a) {
  MEMFIT_CHECK(a.kv_heads == 0 || a.kv_heads == a.heads, "kernels",
               "no CPU kernel for attention with {} kv heads for {} query heads yet", a.kv_heads, a.heads);
  MEMFIT_CHECK(a.batch > 0 && a.seq > 0 && a.heads > 0 && a.head_dim > 0, "kernels",
               "attention with empty shape B={} T={} NH={} HS={}", a.batch, a.seq, a.heads, a.head_dim);
  return AttentionShape{a.batch, a.seq, a.heads, a.head_dim, a.scale};
}

// With b blocks the products compute (b + 1) / 2b of the full T x T work. Measured at
// B=4, T=256, NH=12, HS=64 (2 cores): 1 block 4.3 + 7.6 ms, 2 blocks 3.6 + 6.1 ms, 4 blocks
// 3.4 + 5.5 ms, 8 blocks of 32 no better; so blocks of at least 64 positions, at most 8.
int64_t AttentionShape::blocks() const { return std::clamp<int64_t>(seq / kAttentionBlockMin, 1, kAttentionMaxBlocks); }

void attention_softmax_forward(float* probs, int64_t rows, int64_t seq) {
  parallel_for(rows, kParallelGrain / seq, [=](int64_t first, int64_t last) {
    for (int64_t r = first; r < last; ++r) {
      const int64_t t = r % seq;  // query position: keys 0..t are visible
      float* p = probs + r * seq;
      float mx = p[0];
#pragma omp simd reduction(max : mx)
      for (int64_t s = 0; s <= t; ++s) mx = p[s] > mx ? p[s] : mx;  // not std::max: see vec_math.hpp
      float sum = 0;
#pragma omp simd reduction(+ : sum)
      for (int64_t s = 0; s <= t; ++s) {
        p[s] = softmax_exp(p[s] - mx);
        sum += p[s];
      }
      const float inv = 1.0f / sum;
#pragma omp simd
      for (int64_t s = 0; s <= t; ++s) p[s] *= inv;
      std::fill(p + t + 1, p + seq, 0.0f);
    }
  });
}

void attention_softmax_backward(const float* probs, float* dprobs, int64_t rows, int64_t seq) {
  parallel_for(rows, kParallelGrain / seq, [=](int64_t first, int64_t last) {
    for (int64_t r = first; r < last; ++r) {
      const int64_t t = r % seq;
      const float* p = probs + r * seq;
      float* d = dprobs + r * seq;
      float dot = 0;
#pragma omp simd reduction(+ : dot)
      for (int64_t s = 0; s <= t; ++s) dot += p[s] * d[s];
#pragma omp simd
      for (int64_t s = 0; s <= t; ++s) d[s] = p[s] * (d[s] - dot);
      std::fill(d + t + 1, d + seq, 0.0f);
    }
  });
}

AttentionForwardKernel::AttentionForwardKernel(const DnnlEnv& env, const AttentionShape& shape,
                                               WriteVariants y_modes)
    : shape_(shape) {
  const Views v(shape);
  for (int64_t i = 0; i < shape.blocks(); ++i) {
    const Block q = block(shape, i);
    scores_.emplace_back(env, scores_spec(v, q, shape.scale));
    for_each_variant(y_modes, [&](int acc) { out_[acc].emplace_back(env, out_spec(v, q, acc)); });
  }
}

uint64_t AttentionForwardKernel::scratch_bytes(const DnnlEnv& env, const AttentionShape& shape,
                                               WriteVariants y_modes) {
  const Views v(shape);
  uint64_t bytes = 0;
  for (int64_t i = 0; i < shape.blocks(); ++i) {
    const Block q = block(shape, i);
    bytes = std::max(bytes, DnnlMatmul::scratch_bytes(env, scores_spec(v, q, shape.scale)));
    for_each_variant(y_modes, [&](int acc) {
      bytes = std::max(bytes, DnnlMatmul::scratch_bytes(env, out_spec(v, q, acc)));
    });
  }
  return bytes;
}

void AttentionForwardKernel::bind(const float* qkv, float* y, float* probs, void* scratch) {
  const int64_t C = shape_.channels(), T = shape_.seq;
  for (int64_t i = 0; i < shape_.blocks(); ++i) {
    const Block q = block(shape_, i);
    scores_[size_t(i)].bind(qkv + q.b * 3 * C, qkv + C, nullptr, probs + q.b * T, scratch);
    for (auto& out : out_)
      if (!out.empty() && y) out[size_t(i)].bind(probs + q.b * T, qkv + 2 * C, nullptr, y + q.b * C, scratch);
  }
  probs_ = probs;
  has_y_ = y != nullptr;
}

void AttentionForwardKernel::run(bool acc_y) const {
  for (const DnnlMatmul& mm : scores_) mm.execute();
  attention_softmax_forward(probs_, shape_.batch * shape_.heads * shape_.seq, shape_.seq);
  if (!has_y_) return;  // probabilities only (recomputed for the backward)
  const std::vector<DnnlMatmul>& out = out_[acc_y ? 1 : 0];
  MEMFIT_ASSERT(!out.empty(), "attention prepared without its {} variant", acc_y ? "accumulate" : "overwrite");
  for (const DnnlMatmul& mm : out) mm.execute();
}

AttentionBackwardKernel::AttentionBackwardKernel(const DnnlEnv& env, const AttentionShape& shape,
                                                 WriteVariants dqkv_modes)
    : shape_(shape) {
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

void AttentionBackwardKernel::bind(const float* dy, const float* qkv, const float* probs, float* dqkv, float* dprobs,
                                   void* scratch) {
  const int64_t C = shape_.channels(), T = shape_.seq;
  for (int64_t i = 0; i < shape_.blocks(); ++i) {
    const Block blk = block(shape_, i);
    // As a query block: rows [b, e) of dprobs / dscores against keys [0, e).
    dprobs_mm_[size_t(i)].bind(dy + blk.b * C, qkv + 2 * C, nullptr, dprobs + blk.b * T, scratch);
    // As a key block: the transposed [b, T) x [b, e) block of probs / dscores starts at (b, b).
    const int64_t corner = blk.b * T + blk.b;
    for (int acc = 0; acc < 2; ++acc) {
      if (dq_[acc].empty()) continue;
      dq_[acc][size_t(i)].bind(dprobs + blk.b * T, qkv + C, nullptr, dqkv + blk.b * 3 * C, scratch);
      dv_[acc][size_t(i)].bind(probs + corner, dy + blk.b * C, nullptr, dqkv + 2 * C + blk.b * 3 * C, scratch);
      dk_[acc][size_t(i)].bind(dprobs + corner, qkv + blk.b * 3 * C, nullptr, dqkv + C + blk.b * 3 * C, scratch);
    }
  }
  probs_ = probs;
  dprobs_ = dprobs;
}

void AttentionBackwardKernel::run(bool acc_dqkv) const {
  const int acc = acc_dqkv ? 1 : 0;
  MEMFIT_ASSERT(!dv_[acc].empty(), "attention backward prepared without its {} variant",
                acc_dqkv ? "accumulate" : "overwrite");
  for (const DnnlMatmul& mm : dv_[acc]) mm.execute();
  for (const DnnlMatmul& mm : dprobs_mm_) mm.execute();
  attention_softmax_backward(probs_, dprobs_, shape_.batch * shape_.heads * shape_.seq, shape_.seq);
  for (const DnnlMatmul& mm : dq_[acc]) mm.execute();
  for (const DnnlMatmul& mm : dk_[acc]) mm.execute();
}

}  // namespace memfit
