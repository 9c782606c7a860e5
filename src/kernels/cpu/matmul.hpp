// matmul: C[M,N] = alpha * op(A) op(B) (+ bias[N]), or C += ... in accumulate mode, through
// oneDNN. The transposes of MatmulAttrs are expressed as strides of the operands; linear
// layers pass the weight [out, in] with trans_b. One exception, measured on this CPU with
// oneDNN 2.6: a wide non-transposed B (N >= kStageBMinN) makes oneDNN's brgemm take a path
// without packing B that runs at half speed (~130 vs ~300 GFLOP/s for [768, 3072]), so such
// a B is first transposed into the kernel's scratch and multiplied in the fast layout.
#pragma once

#include <cstdint>

#include "graph/op.hpp"
#include "kernels/cpu/dnnl_matmul.hpp"

namespace memfit {

// Which write variants a kernel must be able to run: the mode decides at prepare time which
// primitives exist, the StepContext picks one of them at run time.
struct WriteVariants {
  bool overwrite = true;
  bool accumulate = false;
  static WriteVariants of(WriteMode mode);
};

// The oneDNN spec of C (+)= alpha op(A) op(B) (+ bias) for packed row-major operands.
DnnlMatmulSpec matmul_spec(const MatmulAttrs& attrs, bool has_bias, bool accumulate);

inline constexpr int64_t kStageBMinN = 2048;
bool stages_b(const MatmulAttrs& attrs);

class MatmulKernel {
 public:
  MatmulKernel(const DnnlEnv& env, const MatmulAttrs& attrs, bool has_bias, WriteVariants variants);
  // Scratch the kernel needs: the larger of its primitives' scratchpads.
  // (plus the staged copy of B when stages_b).
  static uint64_t scratch_bytes(const DnnlEnv& env, const MatmulAttrs& attrs, bool has_bias, WriteVariants variants);

  // Prepare time: the addresses every run uses. bias may be nullptr when there is none.
  void bind(const float* a, const float* b, const float* bias, float* c, void* scratch);
  void run(bool accumulate) const;

 private:
  DnnlMatmul overwrite_, accumulate_;
  const float* b_ = nullptr;  // B as the op stores it, when staged
  float* staged_b_ = nullptr;  // its transpose, at the start of the scratch
  int64_t k_ = 0, n_ = 0;
};

}  // namespace memfit
