// The dequantising products of quant_matmul.hpp on the CPU: each tile of W's rows is
// dequantised (threads split it) into the caller's tile, then multiplied by oneDNN's matmul
// (the same library and strided-operand convention as kernels/cpu/matmul.hpp; bf16 operands
// accumulate in fp32 inside oneDNN):
//   forward      y[:, r0:r0+h] = x * tile^T, written in place in y (row stride rows);
//   input grad   dx = dy[:, 0:h] * tile for the first tile, dx += dy[:, r0:r0+h] * tile after
//                (oneDNN's sum post-op: dx stays fp32 across tiles).
// Construction is prepare time: it builds every primitive (one per tile height and write
// mode) and the oneDNN memory objects, with no addresses. forward() and input_grad() point
// those objects at the caller's spans and run; they allocate nothing in memfit code (oneDNN's
// own bookkeeping runs inside a LibraryCallScope).
#pragma once

#include <dnnl.hpp>

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "core/dtype.hpp"
#include "core/half.hpp"
#include "kernels/cpu/dnnl_matmul.hpp"
#include "kernels/quant/quant_format.hpp"

namespace memfit {

struct QuantLinearShape {
  int64_t m = 0;          // rows of x (tokens)
  int64_t rows = 0;       // out_features: rows of W
  int64_t cols = 0;       // in_features
  int64_t tile_rows = 0;  // rows of W per tile (clamped to rows)
  DType compute = DType::bf16;  // bf16 or f32: x, y, dy and the tile
};

class CpuQuantLinear {
 public:
  CpuQuantLinear(const DnnlEnv& env, const QuantLinearShape& shape);

  const QuantLinearShape& shape() const { return shape_; }
  int64_t tile_elements() const { return shape_.tile_rows * shape_.cols; }
  uint64_t scratch_bytes() const { return scratch_bytes_; }  // the largest primitive's scratchpad

  // T is float for f32 compute and bf16_t for bf16; the weight's shape must be [rows, cols].
  template <class T>
  void forward(std::span<const T> x, const QuantizedWeight& w, std::span<T> tile, std::span<std::byte> scratch,
               std::span<T> y);
  template <class T>
  void input_grad(std::span<const T> dy, const QuantizedWeight& w, std::span<T> tile, std::span<std::byte> scratch,
                  std::span<float> dx);

 private:
  // One primitive with its memory objects; the handles are set before each run.
  struct Product {
    dnnl::matmul::primitive_desc pd;
    dnnl::primitive prim;
    dnnl::memory src, wei, dst, scratch;
    bool valid() const { return bool(prim); }
    void run(const DnnlEnv& env, const void* a, const void* b, void* c, void* scratchpad);
  };
  Product make(const DnnlMatmulSpec& spec);
  template <class T>
  void check_call(const QuantizedWeight& w, uint64_t in, uint64_t tile, uint64_t scratch, uint64_t out, bool grad) const;
  template <class T>
  void dequantize_tile(const QuantizedWeight& w, int64_t r0, int64_t height, std::span<T> tile) const;

  DnnlEnv env_;
  QuantLinearShape shape_;
  uint64_t scratch_bytes_ = 0;
  // Forward: a full tile and the shorter last one. Input grad: the first tile (overwrite),
  // later full tiles and the shorter last one (accumulate).
  Product forward_full_, forward_last_, grad_first_, grad_full_, grad_last_;
};

}  // namespace memfit
