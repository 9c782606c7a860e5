// matmul: C[M,N] = alpha * op(A) op(B) (+ bias[N]), or C += ... in accumulate mode, through
// oneDNN. The transposes of MatmulAttrs are expressed as strides of the operands, so no
// operand is ever copied; linear layers pass the weight [out, in] with trans_b.
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

class MatmulKernel {
 public:
  MatmulKernel(const DnnlEnv& env, const MatmulAttrs& attrs, bool has_bias, WriteVariants variants);
  // Scratch the kernel needs: the larger of its primitives' scratchpads.
  static uint64_t scratch_bytes(const DnnlEnv& env, const MatmulAttrs& attrs, bool has_bias, WriteVariants variants);

  // Prepare time: the addresses every run uses. bias may be nullptr when there is none.
  void bind(const float* a, const float* b, const float* bias, float* c, void* scratch);
  void run(bool accumulate) const;

 private:
  DnnlMatmul overwrite_, accumulate_;
};

}  // namespace memfit
