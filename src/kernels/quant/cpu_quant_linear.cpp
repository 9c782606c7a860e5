// CPU dequantising products (see cpu_quant_linear.hpp): tiles dequantised in parallel, then
// one oneDNN matmul per tile on operands that are strided views of the caller's spans.
#include "kernels/quant/cpu_quant_linear.hpp"

#include <algorithm>
#include <array>
#include <type_traits>

#include "core/error.hpp"
#include "core/library_scope.hpp"
#include "kernels/cpu/parallel.hpp"
#include "kernels/quant/blockwise.hpp"
#include "kernels/quant/quant_matmul.hpp"

namespace memfit {
namespace {

using dt = dnnl::memory::data_type;

dnnl::memory::desc desc_of(const DnnlOperand& op) { return dnnl::memory::desc(op.dims, op.dt, op.strides); }

}  // namespace

int64_t quant_grad_tile_cols(int64_t rows, int64_t cols, int64_t tile_rows) {
  const int64_t fit = std::min(std::min(rows, tile_rows) * cols / std::max<int64_t>(rows, 1), cols);
  if (fit == cols) return fit;
  if (fit < 16) return 0;  // thinner tiles than tiles of rows
  // As few tiles as fit, of near-equal widths: 2048 columns in 2 x 1024 rather than 1632 + 416.
  const int64_t tiles = (cols + fit - 1) / (fit / 16 * 16);
  return std::min(fit / 16 * 16, ((cols + tiles - 1) / tiles + 15) / 16 * 16);
}

template <class T>
void dequantize_columns(std::span<const QuantizedWeight> segments, int64_t c0, int64_t width, std::span<T> tile) {
  int64_t rows = 0;
  for (const QuantizedWeight& w : segments) {
    MEMFIT_CHECK(c0 >= 0 && width >= 1 && c0 + width <= w.cols && w.cols == segments[0].cols, "kernels",
                 "dequantise columns [{}, {}) of a [{}, {}] weight", c0, c0 + width, w.rows, w.cols);
    rows += w.rows;
  }
  MEMFIT_CHECK(tile.size() >= uint64_t(rows * width), "kernels", "dequantise {} x {} into a tile of {}", rows, width,
               tile.size());
  const int64_t grain = std::max<int64_t>(1, kParallelGrain / width);
  parallel_for(rows, grain, [&](int64_t begin, int64_t end) {
    size_t s = 0;
    int64_t first = 0;  // first row of segment s
    for (int64_t r = begin; r < end; ++r) {
      while (r >= first + segments[s].rows) first += segments[s++].rows;
      const QuantizedWeight& w = segments[s];
      const int64_t at = (r - first) * w.cols + c0;
      dequantize_range<T>(w, at, at + width, tile.subspan(size_t(r * width), size_t(width)));
    }
  });
}

template void dequantize_columns<float>(std::span<const QuantizedWeight>, int64_t, int64_t, std::span<float>);
template void dequantize_columns<bf16_t>(std::span<const QuantizedWeight>, int64_t, int64_t, std::span<bf16_t>);

CpuQuantLinear::CpuQuantLinear(const DnnlEnv& env, const QuantLinearShape& shape) : env_(env), shape_(shape) {
  MEMFIT_CHECK(shape.compute == DType::f32 || shape.compute == DType::bf16, "kernels",
               "quantised products compute in f32 or bf16, not {}", dtype_name(shape.compute));
  MEMFIT_CHECK(shape.m >= 1 && shape.rows >= 1 && shape.cols >= 1 && shape.tile_rows >= 1, "kernels",
               "quantised product of shape m={} rows={} cols={} tile_rows={}", shape.m, shape.rows, shape.cols,
               shape.tile_rows);
  shape_.tile_rows = std::min(shape.tile_rows, shape.rows);
  const int64_t m = shape_.m, rows = shape_.rows, cols = shape_.cols, tile = shape_.tile_rows;
  const int64_t last = rows % tile;
  const dt type = shape.compute == DType::bf16 ? dt::bf16 : dt::f32;
  auto forward_spec = [&](int64_t height) {
    DnnlMatmulSpec spec;
    spec.src = DnnlOperand{{m, cols}, {cols, 1}, type};
    spec.wei = DnnlOperand{{cols, height}, {1, cols}, type};  // the tile [height, cols], transposed
    spec.dst = DnnlOperand{{m, height}, {rows, 1}, type};     // columns r0 .. r0 + height of y
    return spec;
  };
  auto grad_spec = [&](int64_t height, bool accumulate) {
    DnnlMatmulSpec spec;
    spec.src = DnnlOperand{{m, height}, {rows, 1}, type};  // columns r0 .. r0 + height of dy
    spec.wei = DnnlOperand{{height, cols}, {cols, 1}, type};
    spec.dst = DnnlOperand{{m, cols}, {cols, 1}, dt::f32};
    spec.accumulate = accumulate;
    return spec;
  };
  forward_full_ = make(forward_spec(tile));
  if (last > 0) forward_last_ = make(forward_spec(last));
  const bool by_columns =
      shape.grad_tiles == GradTiles::columns || (shape.grad_tiles == GradTiles::automatic && cols >= rows);
  grad_cols_ = by_columns ? quant_grad_tile_cols(rows, cols, tile) : 0;
  if (grad_cols_ > 0) {
    auto column_spec = [&](int64_t width) {
      DnnlMatmulSpec spec;
      spec.src = DnnlOperand{{m, rows}, {rows, 1}, type};
      spec.wei = DnnlOperand{{rows, width}, {width, 1}, type};  // the tile: W's columns c0 .. c0 + width
      spec.dst = DnnlOperand{{m, width}, {cols, 1}, dt::f32};   // the same columns of dx
      return spec;
    };
    grad_full_ = make(column_spec(grad_cols_));
    if (cols % grad_cols_ > 0) grad_last_ = make(column_spec(cols % grad_cols_));
    return;
  }
  grad_first_ = make(grad_spec(tile, false));
  if (rows / tile >= 2) grad_full_ = make(grad_spec(tile, true));
  if (last > 0) grad_last_ = make(grad_spec(last, true));
}

CpuQuantLinear::Product CpuQuantLinear::make(const DnnlMatmulSpec& spec) {
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  if (spec.accumulate) {
    dnnl::post_ops po;
    po.append_sum(1.0f);
    attr.set_post_ops(po);
  }
  Product p;
  try {
    p.pd = dnnl::matmul::primitive_desc(
        dnnl::matmul::desc(desc_of(spec.src), desc_of(spec.wei), desc_of(spec.dst)), attr, env_.engine);
  } catch (const dnnl::error& e) {
    throw Error("kernels", fmt::format("oneDNN has no matmul for this quantised product: {}", e.what()));
  }
  p.prim = dnnl::matmul(p.pd);
  p.src = dnnl::memory(p.pd.src_desc(), env_.engine, DNNL_MEMORY_NONE);
  p.wei = dnnl::memory(p.pd.weights_desc(), env_.engine, DNNL_MEMORY_NONE);
  p.dst = dnnl::memory(p.pd.dst_desc(), env_.engine, DNNL_MEMORY_NONE);
  const uint64_t scratch = p.pd.scratchpad_desc().get_size();
  if (scratch > 0) p.scratch = dnnl::memory(p.pd.scratchpad_desc(), env_.engine, DNNL_MEMORY_NONE);
  scratch_bytes_ = std::max(scratch_bytes_, scratch);
  return p;
}

void CpuQuantLinear::Product::run(const DnnlEnv& env, const void* a, const void* b, void* c, void* scratchpad) {
  MEMFIT_ASSERT(valid(), "quantised product without a primitive for this tile");
  std::array<dnnl_exec_arg_t, 4> args{};
  int n = 0;
  dnnl_status_t status;
  {
    LibraryCallScope scope;
    src.set_data_handle(const_cast<void*>(a));
    wei.set_data_handle(const_cast<void*>(b));
    dst.set_data_handle(c);
    args[size_t(n++)] = dnnl_exec_arg_t{DNNL_ARG_SRC, src.get()};
    args[size_t(n++)] = dnnl_exec_arg_t{DNNL_ARG_WEIGHTS, wei.get()};
    args[size_t(n++)] = dnnl_exec_arg_t{DNNL_ARG_DST, dst.get()};
    if (scratch) {
      scratch.set_data_handle(scratchpad);
      args[size_t(n++)] = dnnl_exec_arg_t{DNNL_ARG_SCRATCHPAD, scratch.get()};
    }
    status = dnnl_primitive_execute(prim.get(), env.stream.get(), n, args.data());
  }
  MEMFIT_CHECK(status == dnnl_success, "kernels", "oneDNN matmul of a quantised product failed with status {}",
               int(status));
}

template <class T>
void CpuQuantLinear::check_call(const QuantizedWeight& w, uint64_t in, uint64_t tile, uint64_t scratch, uint64_t out,
                                bool grad) const {
  const DType t = std::is_same_v<T, float> ? DType::f32 : DType::bf16;
  MEMFIT_CHECK(t == shape_.compute, "kernels", "quantised product prepared for {} called with {} operands",
               dtype_name(shape_.compute), dtype_name(t));
  MEMFIT_CHECK(w.rows == shape_.rows && w.cols == shape_.cols, "kernels",
               "quantised product prepared for a [{}, {}] weight called with [{}, {}]", shape_.rows, shape_.cols, w.rows,
               w.cols);
  check_quant_product(w, shape_.m, shape_.tile_rows, in, tile, out, grad);
  MEMFIT_CHECK(scratch >= scratch_bytes_, "kernels", "quantised product: {} bytes of scratch, oneDNN needs {}", scratch,
               scratch_bytes_);
}

template <class T>
void CpuQuantLinear::dequantize_tile(const QuantizedWeight& w, int64_t r0, int64_t height, std::span<T> tile) const {
  const int64_t base = r0 * shape_.cols;
  parallel_for(height * shape_.cols, kParallelGrain, [&](int64_t begin, int64_t end) {
    dequantize_range<T>(w, base + begin, base + end, tile.subspan(size_t(begin), size_t(end - begin)));
  });
}

template <class T>
void CpuQuantLinear::forward(std::span<const T> x, const QuantizedWeight& w, std::span<T> tile,
                             std::span<std::byte> scratch, std::span<T> y) {
  check_call<T>(w, x.size(), tile.size(), scratch.size(), y.size(), false);
  const int64_t rows = shape_.rows, tile_rows = shape_.tile_rows;
  for (int64_t r0 = 0; r0 < rows; r0 += tile_rows) {
    const int64_t height = std::min(tile_rows, rows - r0);
    dequantize_tile<T>(w, r0, height, tile);
    Product& p = height == tile_rows ? forward_full_ : forward_last_;
    p.run(env_, x.data(), tile.data(), y.data() + r0, scratch.data());
  }
}

template <class T>
void CpuQuantLinear::input_grad(std::span<const T> dy, const QuantizedWeight& w, std::span<T> tile,
                                std::span<std::byte> scratch, std::span<float> dx) {
  check_call<T>(w, dy.size(), tile.size(), scratch.size(), dx.size(), true);
  if (grad_cols_ > 0) {
    for (int64_t c0 = 0; c0 < shape_.cols; c0 += grad_cols_) {
      const int64_t width = std::min(grad_cols_, shape_.cols - c0);
      dequantize_columns<T>(std::span(&w, 1), c0, width, tile);
      (width == grad_cols_ ? grad_full_ : grad_last_).run(env_, dy.data(), tile.data(), dx.data() + c0, scratch.data());
    }
    return;
  }
  const int64_t rows = shape_.rows, tile_rows = shape_.tile_rows;
  for (int64_t r0 = 0; r0 < rows; r0 += tile_rows) {
    const int64_t height = std::min(tile_rows, rows - r0);
    dequantize_tile<T>(w, r0, height, tile);
    Product& p = r0 == 0 ? grad_first_ : height == tile_rows ? grad_full_ : grad_last_;
    p.run(env_, dy.data() + r0, tile.data(), dx.data(), scratch.data());
  }
}

template void CpuQuantLinear::forward<float>(std::span<const float>, const QuantizedWeight&, std::span<float>,
                                             std::span<std::byte>, std::span<float>);
template void CpuQuantLinear::forward<bf16_t>(std::span<const bf16_t>, const QuantizedWeight&, std::span<bf16_t>,
                                              std::span<std::byte>, std::span<bf16_t>);
template void CpuQuantLinear::input_grad<float>(std::span<const float>, const QuantizedWeight&, std::span<float>,
                                                std::span<std::byte>, std::span<float>);
template void CpuQuantLinear::input_grad<bf16_t>(std::span<const bf16_t>, const QuantizedWeight&, std::span<bf16_t>,
                                                 std::span<std::byte>, std::span<float>);

}  // namespace memfit
