// Plain causal attention (probabilities materialised) over a fused qkv tensor (B, T, 3C)
// laid out [q | k | v], head h at columns h*HS of each part (the HF GPT-2 layout).
//
// Grouped-query attention (kv_heads KV < heads NH): qkv is (B, T, (NH + 2KV) HS), per token
// NH query heads, then KV key heads, then KV value heads; query head h reads kv head
// h / (NH / KV) (HF's repeat_kv), and dk, dv of a kv head are the sums over its group of
// query heads. With KV == NH this is exactly the (B, T, 3C) layout. The fp32 tiles run it;
// the bf16 oneDNN path refuses it (flash attention runs it in every dtype).
//
// fp32 runs one (batch, head) per thread on cache-resident tiles (attention_tiles.hpp). bf16
// runs oneDNN batched matmuls over (B, NH) whose strided descriptors read q, k and v straight
// out of qkv and write y and dqkv in their own layouts (oneDNN's bf16 products use the CPU's
// bf16 instructions, which the fp32 tile kernel does not); softmax and its backward are
// OpenMP loops.
//
// bf16 (AttentionShape::dtype): qkv, y, probs and their gradients are bf16 and every product
// runs on oneDNN's bf16 path; softmax and its backward stay fp32. The forward writes the fp32
// scores of one query block into the kernel's scratch, softmaxes them into the bf16 probs;
// the backward gets fp32 dprobs from its product and writes the bf16 dscores over the first
// half of each fp32 row of the same workspace (no second T x T buffer).
#pragma once

#include <cstdint>
#include <vector>

#include "graph/op.hpp"
#include "core/half.hpp"
#include "kernels/cpu/dnnl_matmul.hpp"
#include "kernels/cpu/matmul.hpp"

namespace memfit {

// Causal block splitting only pays while each block keeps the GEMMs reasonably large.
inline constexpr int64_t kAttentionBlockMin = 64;
inline constexpr int64_t kAttentionMaxBlocks = 8;

struct AttentionShape {
  int64_t batch = 0, seq = 0, heads = 0, head_dim = 0;
  float scale = 0;
  DType dtype = DType::f32;  // of qkv, y, probs, dy, dqkv: f32 or bf16
  int64_t kv_heads = 0;      // 0: as many as heads (multi-head attention)
  // Throws [kernels] for an empty shape or heads not a multiple of kv_heads.
  static AttentionShape of(const AttentionAttrs& a);
  int64_t channels() const { return heads * head_dim; }  // of y, dy and the q part
  int64_t kv() const { return kv_heads > 0 ? kv_heads : heads; }
  int64_t group() const { return heads / kv(); }  // query heads per kv head
  int64_t qkv_channels() const { return (heads + 2 * kv()) * head_dim; }  // row of qkv, dqkv
  // Columns within a row of qkv (and dqkv) of query head h, and of key and value head j.
  int64_t q_col(int64_t h) const { return h * head_dim; }
  int64_t k_col(int64_t j) const { return (heads + j) * head_dim; }
  int64_t v_col(int64_t j) const { return (heads + kv() + j) * head_dim; }
  // The causal products are split into this many blocks of sequence positions, so that the
  // blocks above the diagonal (entirely masked) are never computed.
  int64_t blocks() const;
  int64_t block_begin(int64_t i) const { return seq * i / blocks(); }
  int64_t max_block() const;  // rows of the largest block
};

// bf16 softmax. Forward: `rows` rows of fp32 scores at `scores` (row stride seq) whose first row
// is query position `first_pos` of its (b, h); probabilities go to bf16 `probs` (row stride
// seq). Backward: in place over fp32 dprobs rows, writing bf16 dscores over the first half
// of each row's bytes.
void attention_softmax_forward_bf16(const float* scores, bf16_t* probs, int64_t rows, int64_t seq, int64_t first_pos,
                                    int64_t rows_per_head, int64_t scores_head_stride);
void attention_softmax_backward_bf16(const bf16_t* probs, float* dprobs, int64_t rows, int64_t seq);

// in [qkv (B,T,(NH+2KV)HS)] out [y (B,T,C), probs (B,NH,T,T)]; y may be absent (nullptr): probabilities only.
class AttentionForwardKernel {
 public:
  AttentionForwardKernel(const DnnlEnv& env, const AttentionShape& shape, WriteVariants y_modes);
  static uint64_t scratch_bytes(const DnnlEnv& env, const AttentionShape& shape, WriteVariants y_modes);
  void bind(const void* qkv, void* y, void* probs, void* scratch);
  void run(bool acc_y) const;

 private:
  AttentionShape shape_;
  const void* qkv_ = nullptr;
  void* y_ = nullptr;
  void* probs_ = nullptr;
  void* scratch_ = nullptr;
  int threads_ = 1;                // fp32: the threads the tile scratch was sized for
  float* scores_block_ = nullptr;  // bf16: fp32 scores of one query block, in the scratch
  bool has_y_ = true;
  // Per query block: scores = scale q k^T over its causal prefix of keys, and y (+)= probs v.
  std::vector<DnnlMatmul> scores_, out_[2];  // out_[0] overwrite, out_[1] accumulate
};

// in [dy (B,T,C), qkv, probs] out [dqkv (layout of qkv)] workspace [dprobs (B,NH,T,T)].
class AttentionBackwardKernel {
 public:
  AttentionBackwardKernel(const DnnlEnv& env, const AttentionShape& shape, WriteVariants dqkv_modes);
  static uint64_t scratch_bytes(const DnnlEnv& env, const AttentionShape& shape, WriteVariants dqkv_modes);
  void bind(const void* dy, const void* qkv, const void* probs, void* dqkv, float* dprobs, void* scratch);
  void run(bool acc_dqkv) const;

 private:
  AttentionShape shape_;
  const void *dy_ = nullptr, *qkv_ = nullptr, *probs_ = nullptr;
  void *dqkv_ = nullptr, *scratch_ = nullptr;
  float* dprobs_ = nullptr;
  int threads_ = 1;
  // Per query block: dprobs = dy v^T and dq (+)= scale dscores k. Per key block (the queries
  // at or after it): dv (+)= probs^T dy and dk (+)= scale dscores^T q. [0] overwrite,
  // [1] accumulate.
  std::vector<DnnlMatmul> dprobs_mm_, dq_[2], dk_[2], dv_[2];
};

}  // namespace memfit
