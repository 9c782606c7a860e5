// matmul: C[M,N] = alpha * op(A) op(B) (+ bias[N]), or C += ... in accumulate mode.
//
// fp32 products with neither operand transposed (the dX = dY W products of a backward) run
// memfit's sgemm (sgemm.hpp); bf16 products with a side of at most 64 (LoRA's adapters) run
// skinny_bf16.hpp's kernels. Everything else runs oneDNN, with the transposes of MatmulAttrs
// expressed as strides of the operands; linear layers pass the weight [out, in] with trans_b.
// Measured on the Sapphire Rapids machine (docs/benchmarks.md; 2 cores, caches flushed, GPT-2
// 124M shapes), sgemm against oneDNN 2.6 in GFLOP/s: no transpose 302-355 against 230-275
// (112-134 with B wider than 2048 columns); with a transposed operand sgemm was slower in
// every variant tried (forward, B transposed: 224-307 against 297-314; d(weight), A
// transposed: 191-277 against 241-291).
//
// One more oneDNN case, measured with oneDNN 2.6: a wide non-transposed B (N >= kStageBMinN)
// under a transposed A makes its brgemm take a path without packing B that runs at half
// speed (~110 vs ~290 GFLOP/s for [768, 1024] x [1024, 3072]), so such a B is first
// transposed into the kernel's scratch and multiplied in the fast layout. bf16 operands (AMX)
// need no such staging: measured at ~1500 GFLOP/s in either layout.
#pragma once

#include <cstdint>

#include "core/dtype.hpp"
#include "graph/op.hpp"
#include "kernels/cpu/dnnl_matmul.hpp"
#include "kernels/cpu/sgemm.hpp"
#include "kernels/cpu/skinny_bf16.hpp"

namespace memfit {

// Which write variants a kernel must be able to run: the mode decides at prepare time which
// primitives exist, the StepContext picks one of them at run time.
struct WriteVariants {
  bool overwrite = true;
  bool accumulate = false;
  static WriteVariants of(WriteMode mode);
};

// Element types of a product's operands: fp32 throughout, or bf16 A and B (and bias) with a
// bf16 or fp32 C (a parameter gradient keeps its own dtype).
struct MatmulTypes {
  DType a = DType::f32, b = DType::f32, bias = DType::f32, c = DType::f32;
};
dnnl::memory::data_type dnnl_type(DType t);  // throws [kernels] for types oneDNN products do not take

// The oneDNN spec of C (+)= alpha op(A) op(B) (+ bias) for packed row-major operands.
DnnlMatmulSpec matmul_spec(const MatmulAttrs& attrs, bool has_bias, bool accumulate, const MatmulTypes& types = {});

// Whether the product runs memfit's sgemm (fp32, neither operand transposed).
bool runs_sgemm(const MatmulAttrs& attrs, const MatmulTypes& types = {});

// Whether oneDNN's B is first transposed into the scratch (fp32, B not transposed and at
// least kStageBMinN wide, A transposed: the products without a transpose run sgemm).
inline constexpr int64_t kStageBMinN = 2048;
bool stages_b(const MatmulAttrs& attrs, const MatmulTypes& types = {});

class MatmulKernel {
 public:
  MatmulKernel(const DnnlEnv& env, const MatmulAttrs& attrs, bool has_bias, WriteVariants variants,
               const MatmulTypes& types = {});
  // Scratch the kernel needs: sgemm's packed strips, or the larger of its primitives'
  // scratchpads (plus the staged copy of B when stages_b).
  static uint64_t scratch_bytes(const DnnlEnv& env, const MatmulAttrs& attrs, bool has_bias, WriteVariants variants,
                                const MatmulTypes& types = {});

  // Prepare time: the addresses every run uses. bias may be nullptr when there is none.
  void bind(const void* a, const void* b, const void* bias, void* c, void* scratch);
  void run(bool accumulate) const;

 private:
  // skinny bf16 products (skinny_bf16.hpp): the attributes and the bound addresses.
  bool skinny_ = false, c_bf16_ = false;
  MatmulAttrs attrs_;
  const uint16_t *skinny_a_ = nullptr, *skinny_b_ = nullptr;
  void* skinny_c_ = nullptr;
  // sgemm products: the shape and the bound addresses.
  bool sgemm_ = false;
  SgemmShape sgemm_shape_;
  int threads_ = 1;
  const float *a_ = nullptr, *bias_ = nullptr;
  float* c_ = nullptr;
  void* scratch_ = nullptr;
  // oneDNN products.
  DnnlMatmul overwrite_, accumulate_;
  const float* b_ = nullptr;  // B as the op stores it (sgemm, or staged for oneDNN)
  float* staged_b_ = nullptr;  // its transpose, at the start of the scratch
  int64_t k_ = 0, n_ = 0;
};

}  // namespace memfit
