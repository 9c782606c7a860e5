// Fused classifier: logits = x wte^T, per-row cross-entropy against integer targets, and
// (in training) the gradients dx = dlogits wte and dwte = dlogits^T x, computed chunk by
// chunk of rows so that the (N, Vp) logits never exist beyond one (R, Vp) chunk.
//
// bf16 (ClassifierShape::dtype): x, wte and dx are bf16, dwte has its own dtype; the logits
// chunk stays fp32 (the loss and softmax run in fp32). The row pass writes the bf16 dlogits
// densely over the start of the same chunk (rows in generations, so that no row is
// overwritten before it is read), and the two gradient products read them from there on
// oneDNN's bf16 (AMX) path.
#pragma once

#include <algorithm>
#include <cstdint>

#include "core/dtype.hpp"

#include "kernels/cpu/dnnl_matmul.hpp"
#include "kernels/cpu/matmul.hpp"

namespace memfit {

struct ClassifierShape {
  int64_t rows = 0;          // N
  int64_t channels = 0;      // C
  int64_t vocab = 0;         // V: global columns that take part in the softmax
  int64_t padded_vocab = 0;  // Vp (the fused op: >= V): rows of wte and columns of the logits
  int64_t chunk_rows = 0;    // R: rows of logits materialised at once (the last chunk may be shorter)
  // The global column of wte's row 0: nonzero for a tensor-parallel rank's vocabulary slice
  // (classifier_parallel.hpp), whose rows past global column V are padding.
  int64_t vocab_begin = 0;
  DType dtype = DType::f32;       // x, wte, dx: f32 or bf16
  DType grad_dtype = DType::f32;  // dwte
  bool bf16() const { return dtype == DType::bf16; }
  // Columns of the logits that take part in the softmax: the first ones, up to global column V.
  int64_t real_columns() const { return std::clamp<int64_t>(vocab - vocab_begin, 0, padded_vocab); }
};

// What the row pass makes of a chunk of logits: the fused op's losses and d(logits), or one of
// the vocabulary-parallel ops' (classifier_parallel.hpp): a slice's softmax statistics (no
// gradient), or d(logits) from a log-sum-exp that the tensor group combined.
enum class ClassifierPass : uint8_t { fused, partial_stats, backward_from_lse };

// Which outputs the op has and how each may be written. Eval has only losses.
struct ClassifierOutputs {
  ClassifierPass pass = ClassifierPass::fused;
  bool losses = true, dx = false, dwte = false;
  WriteVariants dx_modes, dwte_modes;
};

class ClassifierKernel {
 public:
  ClassifierKernel(const DnnlEnv& env, const ClassifierShape& shape, const ClassifierOutputs& outputs);
  static uint64_t scratch_bytes(const DnnlEnv& env, const ClassifierShape& shape, const ClassifierOutputs& outputs);

  // logits is the (R, Vp) workspace chunk. Pointers of absent outputs are nullptr. stats (N, 3)
  // is the partial_stats pass's output, lse (N) the backward_from_lse pass's input.
  void bind(const void* x, const void* wte, const int32_t* targets, float* losses, void* dx, void* dwte,
            float* logits, void* scratch, float* stats = nullptr, const float* lse = nullptr);
  // dscale multiplies d(loss_i)/d(logits): grad_scale * loss_scale. acc_dwte is the mode of
  // the first chunk only; later chunks always add.
  void run(float dscale, bool acc_dx, bool acc_dwte) const;

 private:
  void rows_pass(int64_t row0, int64_t count, float dscale) const;

  ClassifierShape shape_;
  ClassifierOutputs outputs_;
  int64_t chunk_ = 0, full_chunks_ = 0, tail_rows_ = 0;
  const int32_t* targets_ = nullptr;
  float* losses_ = nullptr;
  float* stats_ = nullptr;
  const float* lse_ = nullptr;
  float* logits_ = nullptr;
  const void* wte_ = nullptr;
  void* dx_ = nullptr;  // the op's dx (N, C)
  void* scratch_ = nullptr;
  int threads_ = 1;  // fp32 dx runs sgemm with scratch for this many threads
  // [0] full chunks, [1] the tail chunk; dwte_ and dx_mm_ further by [overwrite, accumulate].
  // dx_mm_ is bf16 only (fp32 dx runs sgemm).
  DnnlMatmul logits_mm_[2], dx_mm_[2][2], dwte_mm_[2][2];
};

}  // namespace memfit
