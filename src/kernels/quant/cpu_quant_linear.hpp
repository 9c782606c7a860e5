// The dequantising products of quant_matmul.hpp on the CPU: each tile of W's rows is
// dequantised (threads split it) into the caller's tile, then multiplied by oneDNN's matmul
// (the same library and strided-operand convention as kernels/cpu/matmul.hpp; bf16 operands
// accumulate in fp32 inside oneDNN):
//   forward      y[:, r0:r0+h] = x * tile^T, written in place in y (row stride rows);
//   input grad   dx[:, c0:c0+w] = dy * tile, the tile then W's columns c0 .. c0 + w ([rows, w]):
//                each element of dx is one product over all of W's rows, summed in fp32 inside
//                oneDNN and written once. (Tiles of rows split the sum instead: dx += dy[:, r0:
//                r0+h] * tile after the first, an fp32 read and write of all of dx per tile,
//                which made the input gradient of a wide dx ~2x its forward; kept as
//                GradTiles::rows for bench/quant_bench's comparison.)
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

// automatic: columns where W is at least as wide as tall (dx is then the wider side, and the
// row tiles' fp32 re-reads of it cost most: down_proj's gradient 0.74x by columns), rows where
// it is taller (gate_proj's 1.09x by columns: its strips of ~700 columns dequantise and multiply
// less well than whole rows); bench/quant_bench, one thread, docs/benchmarks.md.
enum class GradTiles { automatic, columns, rows };

struct QuantLinearShape {
  int64_t m = 0;          // rows of x (tokens)
  int64_t rows = 0;       // out_features: rows of W
  int64_t cols = 0;       // in_features
  int64_t tile_rows = 0;  // rows of W per tile (clamped to rows)
  DType compute = DType::bf16;  // bf16 or f32: x, y, dy and the tile
  GradTiles grad_tiles = GradTiles::automatic;
};

// Columns of W per tile of the input gradient: as many as fit the forward's tile of tile_rows
// rows (so one workspace serves both), in near-equal multiples of 16 where W is wider; 0 where
// fewer than 16 columns fit, and the gradient then takes tiles of rows.
int64_t quant_grad_tile_cols(int64_t rows, int64_t cols, int64_t tile_rows);

// Dequantises W[:, c0:c0+width] into tile ([rows, width], row-major); threads split the rows.
// W may be segments stacked by rows, each quantised on its own (the fused q, k, v weight), all
// of the same columns.
template <class T>
void dequantize_columns(std::span<const QuantizedWeight> segments, int64_t c0, int64_t width, std::span<T> tile);

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
  int64_t grad_cols_ = 0;  // GradTiles::columns: columns per tile; grad_full_ / grad_last_ then
                           // write a full and the last, narrower, column block of dx
};

}  // namespace memfit
