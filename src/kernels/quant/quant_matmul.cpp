// Reference dequantising products (see quant_matmul.hpp): one tile of W's rows at a time,
// plain loops, each dot product summed in double.
#include "kernels/quant/quant_matmul.hpp"

#include <algorithm>
#include <type_traits>

#include "core/error.hpp"
#include "kernels/quant/blockwise.hpp"

namespace memfit {
namespace {

template <class T>
T round_to(double v) {
  if constexpr (std::is_same_v<T, float>) {
    return float(v);
  } else {
    return round_to_bf16(float(v));
  }
}

}  // namespace

int64_t quant_tile_elements(const QuantizedWeight& w, int64_t tile_rows) {
  MEMFIT_CHECK(tile_rows >= 1, "kernels", "a dequantisation tile of {} rows", tile_rows);
  return std::min(tile_rows, std::max<int64_t>(w.rows, 1)) * w.cols;
}

void check_quant_product(const QuantizedWeight& w, int64_t m, int64_t tile_rows, uint64_t in_elements,
                         uint64_t tile_elements, uint64_t out_elements, bool input_grad) {
  check_quantized_weight(w);
  MEMFIT_CHECK(m >= 0, "kernels", "a quantised product of {} rows", m);
  const uint64_t in_width = uint64_t(input_grad ? w.rows : w.cols), out_width = uint64_t(input_grad ? w.cols : w.rows);
  const char* in_name = input_grad ? "dy" : "x";
  const char* out_name = input_grad ? "dx" : "y";
  MEMFIT_CHECK(in_elements == uint64_t(m) * in_width, "kernels", "quantised product: {} has {} elements, not {} x {}",
               in_name, in_elements, m, in_width);
  MEMFIT_CHECK(out_elements == uint64_t(m) * out_width, "kernels", "quantised product: {} has {} elements, not {} x {}",
               out_name, out_elements, m, out_width);
  const uint64_t need = uint64_t(quant_tile_elements(w, tile_rows));
  MEMFIT_CHECK(tile_elements >= need, "kernels",
               "quantised product: the tile has {} elements, {} rows of {} need {}", tile_elements,
               std::min(tile_rows, w.rows), w.cols, need);
}

template <class T>
void quant_linear_forward_reference(std::span<const T> x, int64_t m, const QuantizedWeight& w, int64_t tile_rows,
                                    std::span<T> tile, std::span<T> y) {
  check_quant_product(w, m, tile_rows, x.size(), tile.size(), y.size(), false);
  const int64_t rows = w.rows, cols = w.cols;
  for (int64_t r0 = 0; r0 < rows; r0 += tile_rows) {
    const int64_t height = std::min(tile_rows, rows - r0);
    dequantize_range<T>(w, r0 * cols, (r0 + height) * cols, tile.first(size_t(height * cols)));
    for (int64_t i = 0; i < m; ++i)
      for (int64_t r = 0; r < height; ++r) {
        double sum = 0.0;
        for (int64_t k = 0; k < cols; ++k)
          sum += double(widen(x[size_t(i * cols + k)])) * double(widen(tile[size_t(r * cols + k)]));
        y[size_t(i * rows + r0 + r)] = round_to<T>(sum);
      }
  }
}

template <class T>
void quant_linear_input_grad_reference(std::span<const T> dy, int64_t m, const QuantizedWeight& w, int64_t tile_rows,
                                       std::span<T> tile, std::span<float> dx) {
  check_quant_product(w, m, tile_rows, dy.size(), tile.size(), dx.size(), true);
  const int64_t rows = w.rows, cols = w.cols;
  std::fill(dx.begin(), dx.end(), 0.0f);
  for (int64_t r0 = 0; r0 < rows; r0 += tile_rows) {
    const int64_t height = std::min(tile_rows, rows - r0);
    dequantize_range<T>(w, r0 * cols, (r0 + height) * cols, tile.first(size_t(height * cols)));
    for (int64_t i = 0; i < m; ++i)
      for (int64_t k = 0; k < cols; ++k) {
        double sum = 0.0;
        for (int64_t r = 0; r < height; ++r)
          sum += double(widen(dy[size_t(i * rows + r0 + r)])) * double(widen(tile[size_t(r * cols + k)]));
        dx[size_t(i * cols + k)] += float(sum);
      }
  }
}

template void quant_linear_forward_reference<float>(std::span<const float>, int64_t, const QuantizedWeight&, int64_t,
                                                    std::span<float>, std::span<float>);
template void quant_linear_forward_reference<bf16_t>(std::span<const bf16_t>, int64_t, const QuantizedWeight&,
                                                     int64_t, std::span<bf16_t>, std::span<bf16_t>);
template void quant_linear_input_grad_reference<float>(std::span<const float>, int64_t, const QuantizedWeight&,
                                                       int64_t, std::span<float>, std::span<float>);
template void quant_linear_input_grad_reference<bf16_t>(std::span<const bf16_t>, int64_t, const QuantizedWeight&,
                                                        int64_t, std::span<bf16_t>, std::span<float>);

}  // namespace memfit
