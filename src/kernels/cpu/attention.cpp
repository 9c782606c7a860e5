// Causal attention forward and backward with materialised probabilities (see attention.hpp).
//
// Subtle point: every operand is a strided 4-D view {B, NH, rows, cols} of a tensor laid out
// for the rest of the model. q of head h is at qkv + h*HS with strides {T*3C, HS, 3C, 1};
// k^T is the same bytes at offset C with the last two strides swapped; y and the three parts
// of dqkv are written in place of their (B, T, ...) layouts. No transpose or copy is ever
// made, and the backward computes dV = probs^T dy before the softmax backward turns dprobs
// into dscores in place.
#include "kernels/cpu/attention.hpp"

#include <algorithm>

#include "core/error.hpp"
#include "kernels/cpu/parallel.hpp"
#include "kernels/cpu/vec_math.hpp"

namespace memfit {
namespace {

// Views of qkv parts, y / dy, and (B, NH, T, T) probability-shaped tensors.
struct Views {
  int64_t B, NH, T, HS, C;
  explicit Views(const AttentionShape& s) : B(s.batch), NH(s.heads), T(s.seq), HS(s.head_dim), C(s.channels()) {}
  // q, k or v (any part of qkv or dqkv) as {B, NH, T, HS}.
  DnnlOperand part() const { return {{B, NH, T, HS}, {T * 3 * C, HS, 3 * C, 1}}; }
  // the same part transposed to {B, NH, HS, T}.
  DnnlOperand part_t() const { return {{B, NH, HS, T}, {T * 3 * C, HS, 1, 3 * C}}; }
  // y or dy (B, T, C) as {B, NH, T, HS}.
  DnnlOperand rows() const { return {{B, NH, T, HS}, {T * C, HS, C, 1}}; }
  DnnlOperand square() const { return {{B, NH, T, T}, {NH * T * T, T * T, T, 1}}; }
  DnnlOperand square_t() const { return {{B, NH, T, T}, {NH * T * T, T * T, 1, T}}; }
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

// The products of the forward: scores = scale * q k^T and y (+)= probs v.
DnnlMatmulSpec scores_spec(const Views& v, float scale) { return spec(v.part(), v.part_t(), v.square(), scale, false); }
DnnlMatmulSpec out_spec(const Views& v, bool acc) { return spec(v.square(), v.part(), v.rows(), 1.0f, acc); }
// The products of the backward.
DnnlMatmulSpec dprobs_spec(const Views& v) { return spec(v.rows(), v.part_t(), v.square(), 1.0f, false); }
DnnlMatmulSpec dv_spec(const Views& v, bool acc) { return spec(v.square_t(), v.rows(), v.part(), 1.0f, acc); }
DnnlMatmulSpec dq_spec(const Views& v, float scale, bool acc) { return spec(v.square(), v.part(), v.part(), scale, acc); }
DnnlMatmulSpec dk_spec(const Views& v, float scale, bool acc) {
  return spec(v.square_t(), v.part(), v.part(), scale, acc);
}

}  // namespace

AttentionShape AttentionShape::of(const AttentionAttrs& a) {
  MEMFIT_CHECK(a.kv_heads == 0 || a.kv_heads == a.heads, "kernels",
               "no CPU kernel for attention with {} kv heads for {} query heads yet", a.kv_heads, a.heads);
  MEMFIT_CHECK(a.batch > 0 && a.seq > 0 && a.heads > 0 && a.head_dim > 0, "kernels",
               "attention with empty shape B={} T={} NH={} HS={}", a.batch, a.seq, a.heads, a.head_dim);
  return AttentionShape{a.batch, a.seq, a.heads, a.head_dim, a.scale};
}

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
  scores_ = DnnlMatmul(env, scores_spec(v, shape.scale));
  if (y_modes.overwrite) out_ = DnnlMatmul(env, out_spec(v, false));
  if (y_modes.accumulate) out_acc_ = DnnlMatmul(env, out_spec(v, true));
}

uint64_t AttentionForwardKernel::scratch_bytes(const DnnlEnv& env, const AttentionShape& shape,
                                               WriteVariants y_modes) {
  const Views v(shape);
  uint64_t bytes = DnnlMatmul::scratch_bytes(env, scores_spec(v, shape.scale));
  if (y_modes.overwrite) bytes = std::max(bytes, DnnlMatmul::scratch_bytes(env, out_spec(v, false)));
  if (y_modes.accumulate) bytes = std::max(bytes, DnnlMatmul::scratch_bytes(env, out_spec(v, true)));
  return bytes;
}

void AttentionForwardKernel::bind(const float* qkv, float* y, float* probs, void* scratch) {
  const int64_t C = shape_.channels();
  scores_.bind(qkv, qkv + C, nullptr, probs, scratch);
  if (out_.valid()) out_.bind(probs, qkv + 2 * C, nullptr, y, scratch);
  if (out_acc_.valid()) out_acc_.bind(probs, qkv + 2 * C, nullptr, y, scratch);
  probs_ = probs;
}

void AttentionForwardKernel::run(bool acc_y) const {
  scores_.execute();
  attention_softmax_forward(probs_, shape_.batch * shape_.heads * shape_.seq, shape_.seq);
  const DnnlMatmul& out = acc_y ? out_acc_ : out_;
  MEMFIT_ASSERT(out.valid(), "attention prepared without its {} variant", acc_y ? "accumulate" : "overwrite");
  out.execute();
}

AttentionBackwardKernel::AttentionBackwardKernel(const DnnlEnv& env, const AttentionShape& shape,
                                                 WriteVariants dqkv_modes)
    : shape_(shape) {
  const Views v(shape);
  dprobs_mm_ = DnnlMatmul(env, dprobs_spec(v));
  for (int acc = 0; acc < 2; ++acc) {
    if (acc ? !dqkv_modes.accumulate : !dqkv_modes.overwrite) continue;
    dv_[acc] = DnnlMatmul(env, dv_spec(v, acc));
    dq_[acc] = DnnlMatmul(env, dq_spec(v, shape.scale, acc));
    dk_[acc] = DnnlMatmul(env, dk_spec(v, shape.scale, acc));
  }
}

uint64_t AttentionBackwardKernel::scratch_bytes(const DnnlEnv& env, const AttentionShape& shape,
                                                WriteVariants dqkv_modes) {
  const Views v(shape);
  uint64_t bytes = DnnlMatmul::scratch_bytes(env, dprobs_spec(v));
  for (int acc = 0; acc < 2; ++acc) {
    if (acc ? !dqkv_modes.accumulate : !dqkv_modes.overwrite) continue;
    bytes = std::max({bytes, DnnlMatmul::scratch_bytes(env, dv_spec(v, acc)),
                      DnnlMatmul::scratch_bytes(env, dq_spec(v, shape.scale, acc)),
                      DnnlMatmul::scratch_bytes(env, dk_spec(v, shape.scale, acc))});
  }
  return bytes;
}

void AttentionBackwardKernel::bind(const float* dy, const float* qkv, const float* probs, float* dqkv, float* dprobs,
                                   void* scratch) {
  const int64_t C = shape_.channels();
  dprobs_mm_.bind(dy, qkv + 2 * C, nullptr, dprobs, scratch);
  for (int acc = 0; acc < 2; ++acc) {
    if (!dv_[acc].valid()) continue;
    dv_[acc].bind(probs, dy, nullptr, dqkv + 2 * C, scratch);
    dq_[acc].bind(dprobs, qkv + C, nullptr, dqkv, scratch);
    dk_[acc].bind(dprobs, qkv, nullptr, dqkv + C, scratch);
  }
  probs_ = probs;
  dprobs_ = dprobs;
}

void AttentionBackwardKernel::run(bool acc_dqkv) const {
  const int acc = acc_dqkv ? 1 : 0;
  MEMFIT_ASSERT(dv_[acc].valid(), "attention backward prepared without its {} variant",
                acc_dqkv ? "accumulate" : "overwrite");
  dv_[acc].execute();
  dprobs_mm_.execute();
  attention_softmax_backward(probs_, dprobs_, shape_.batch * shape_.heads * shape_.seq, shape_.seq);
  dq_[acc].execute();
  dk_[acc].execute();
}

}  // namespace memfit
