// One oneDNN matmul primitive prepared for fixed addresses. Everything that allocates
// (descriptors, the primitive, its JIT code, the dnnl::memory objects, the argument array) is
// made at prepare time; execute() is one call of the C API with a preassembled argument
// array inside a LibraryCallScope.
//
// Subtle point: oneDNN computes dst = scale * (src . wei + bias) — the bias is scaled too —
// so a product with alpha != 1 and a bias takes the bias as a binary-add post-op instead,
// which is applied after the scale. Accumulation (dst += ...) is a sum post-op, which reads
// dst before the primitive writes it.
#pragma once

#include <dnnl.hpp>

#include <array>
#include <cstdint>
#include <vector>

namespace memfit {

// The oneDNN engine and stream shared by every kernel of one backend (handles are
// reference-counted, so kernels hold copies).
struct DnnlEnv {
  dnnl::engine engine;
  dnnl::stream stream;
  static DnnlEnv make_cpu();
};

// A strided operand: dims and element strides, outermost first, as oneDNN takes them. The
// last two dims are the matrix, any leading ones are batch dims. bf16 operands accumulate in
// fp32 inside oneDNN and are rounded once when stored.
struct DnnlOperand {
  dnnl::memory::dims dims;
  dnnl::memory::dims strides;
  dnnl::memory::data_type dt = dnnl::memory::data_type::f32;
};

struct DnnlMatmulSpec {
  DnnlOperand src, wei, dst;
  bool bias = false;        // a bias of N elements broadcast over the rows of dst
  dnnl::memory::data_type bias_dt = dnnl::memory::data_type::f32;
  float scale = 1.0f;       // dst = scale * src . wei (+ bias)
  bool accumulate = false;  // dst += ... instead of dst = ...
};

// Packed row-major matrix [rows, cols], or its transpose when `transposed` (the bytes then
// hold [cols, rows]), as a 2-D operand.
DnnlOperand dnnl_matrix(int64_t rows, int64_t cols, bool transposed,
                        dnnl::memory::data_type dt = dnnl::memory::data_type::f32);

class DnnlMatmul {
 public:
  DnnlMatmul() = default;
  DnnlMatmul(const DnnlEnv& env, const DnnlMatmulSpec& spec);

  // Scratchpad bytes of the primitive this spec makes; needs no primitive (no JIT).
  static uint64_t scratch_bytes(const DnnlEnv& env, const DnnlMatmulSpec& spec);
  uint64_t scratch_bytes() const { return scratch_bytes_; }

  // Adds one set of addresses and returns its index for execute(); prepare time only.
  // scratch may be nullptr only when scratch_bytes() is 0; bias is ignored without spec.bias.
  int bind(const void* src, const void* wei, const void* bias, void* dst, void* scratch);

  // Runs the product on binding `index`. Allocates nothing in memfit code.
  void execute(int index = 0) const;
  bool valid() const { return bool(prim_); }
  // oneDNN's name for the implementation it picked ("brg:avx512_core", "gemm:jit", ...), for
  // diagnosing a slow product (a "ref:" implementation is orders of magnitude slower).
  const char* impl_name() const { return pd_.impl_info_str(); }

 private:
  struct Bound {
    std::vector<dnnl::memory> memories;  // keeps the handles in args alive
    std::array<dnnl_exec_arg_t, 6> args{};
    int nargs = 0;
  };
  DnnlEnv env_;
  DnnlMatmulSpec spec_;
  dnnl::matmul::primitive_desc pd_;
  dnnl::primitive prim_;
  uint64_t scratch_bytes_ = 0;
  bool bias_as_post_op_ = false;
  std::vector<Bound> bound_;
};

}  // namespace memfit
