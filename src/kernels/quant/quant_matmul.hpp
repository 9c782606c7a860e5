// Products with a quantised frozen weight W [rows = out_features, cols = in_features], the two a
// QLoRA linear layer needs (the weight gradient of a frozen weight is never formed):
//   forward      y[m, rows]  = x[m, cols] * dequant(W)^T
//   input grad   dx[m, cols] = dy[m, rows] * dequant(W)
// W is dequantised tile_rows rows at a time into a caller-provided tile of tile_rows x cols
// elements in the compute type (bf16_t or float), so the whole weight is never expanded; the
// tile is the plan's temporary. Nothing here allocates.
//
// This header holds the backend-neutral reference (plain loops, sums in double, rounded once
// to the output type); kernels/quant/cpu_quant_linear.hpp is the CPU version on oneDNN.
// The input gradient is written in fp32: it sums over every tile, and rounding it to bf16
// after each tile would add one rounding per tile; a bf16 consumer casts it once.
#pragma once

#include <cstdint>
#include <span>

#include "core/half.hpp"
#include "kernels/quant/quant_format.hpp"

namespace memfit {

// Elements of the tile a product with tile_rows rows per tile needs (tile_rows is clamped to
// the weight's rows: a weight shorter than one tile is one tile).
int64_t quant_tile_elements(const QuantizedWeight& w, int64_t tile_rows);

// Checks the operands of a product ([kernels] on a mismatch): x (or dy) of m rows, the output,
// the tile large enough for tile_rows rows, a valid weight.
void check_quant_product(const QuantizedWeight& w, int64_t m, int64_t tile_rows, uint64_t in_elements,
                         uint64_t tile_elements, uint64_t out_elements, bool input_grad);

template <class T>
void quant_linear_forward_reference(std::span<const T> x, int64_t m, const QuantizedWeight& w, int64_t tile_rows,
                                    std::span<T> tile, std::span<T> y);

template <class T>
void quant_linear_input_grad_reference(std::span<const T> dy, int64_t m, const QuantizedWeight& w, int64_t tile_rows,
                                       std::span<T> tile, std::span<float> dx);

}  // namespace memfit
