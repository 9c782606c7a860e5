// Plain causal attention (probabilities materialised) over a fused qkv tensor (B, T, 3C)
// laid out [q | k | v], head h at columns h*HS of each part (the HF GPT-2 layout). The
// products are oneDNN batched matmuls over (B, NH) whose strided descriptors read q, k and v
// straight out of qkv and write y and dqkv in their own layouts; softmax and its backward
// are OpenMP loops.
#pragma once

#include <cstdint>
#include <vector>

#include "graph/op.hpp"
#include "kernels/cpu/dnnl_matmul.hpp"
#include "kernels/cpu/matmul.hpp"

namespace memfit {

// Causal block splitting only pays while each block keeps the GEMMs reasonably large.
inline constexpr int64_t kAttentionBlockMin = 64;
inline constexpr int64_t kAttentionMaxBlocks = 8;

struct AttentionShape {
  int64_t batch = 0, seq = 0, heads = 0, head_dim = 0;
  float scale = 0;
  static AttentionShape of(const AttentionAttrs& a);  // throws [kernels] for grouped kv heads
  int64_t channels() const { return heads * head_dim; }
  // The causal products are split into this many blocks of sequence positions, so that the
  // blocks above the diagonal (entirely masked) are never computed.
  int64_t blocks() const;
  int64_t block_begin(int64_t i) const { return seq * i / blocks(); }
};

// In place over probs (B, NH, T, T) holding scaled scores: causal softmax per row, future
// positions set to exactly 0.
void attention_softmax_forward(float* probs, int64_t rows, int64_t seq);
// In place over dprobs holding dL/dprobs: dscores = probs * (dprobs - sum(probs * dprobs)),
// future positions exactly 0. The attention scale is applied by the products that follow.
void attention_softmax_backward(const float* probs, float* dprobs, int64_t rows, int64_t seq);

// in [qkv] out [y (B,T,C), probs (B,NH,T,T)]; y may be absent (nullptr): probabilities only.
class AttentionForwardKernel {
 public:
  AttentionForwardKernel(const DnnlEnv& env, const AttentionShape& shape, WriteVariants y_modes);
  static uint64_t scratch_bytes(const DnnlEnv& env, const AttentionShape& shape, WriteVariants y_modes);
  void bind(const float* qkv, float* y, float* probs, void* scratch);
  void run(bool acc_y) const;

 private:
  AttentionShape shape_;
  float* probs_ = nullptr;
  bool has_y_ = true;
  // Per query block: scores = scale q k^T over its causal prefix of keys, and y (+)= probs v.
  std::vector<DnnlMatmul> scores_, out_[2];  // out_[0] overwrite, out_[1] accumulate
};

// in [dy (B,T,C), qkv, probs] out [dqkv (B,T,3C)] workspace [dprobs (B,NH,T,T)].
class AttentionBackwardKernel {
 public:
  AttentionBackwardKernel(const DnnlEnv& env, const AttentionShape& shape, WriteVariants dqkv_modes);
  static uint64_t scratch_bytes(const DnnlEnv& env, const AttentionShape& shape, WriteVariants dqkv_modes);
  void bind(const float* dy, const float* qkv, const float* probs, float* dqkv, float* dprobs, void* scratch);
  void run(bool acc_dqkv) const;

 private:
  AttentionShape shape_;
  const float* probs_ = nullptr;
  float* dprobs_ = nullptr;
  // Per query block: dprobs = dy v^T and dq (+)= scale dscores k. Per key block (the queries
  // at or after it): dv (+)= probs^T dy and dk (+)= scale dscores^T q. [0] overwrite,
  // [1] accumulate.
  std::vector<DnnlMatmul> dprobs_mm_, dq_[2], dk_[2], dv_[2];
};

}  // namespace memfit
