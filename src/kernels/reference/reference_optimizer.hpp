// Naive reference kernels of the optimizer section: blockwise 8-bit quantization with the
// dynamic maps (kernels/quant_map.hpp), 8-bit blockwise AdamW and the global gradient norm.
// Plain loops in double, an exhaustive search for the nearest code: the oracle the CPU
// kernels (which use a bucketed search and fp32 arithmetic) are tested against.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/quant_map.hpp"

namespace memfit::ref {

// Code of the map entry nearest to y; of two equally near entries, the lower.
uint8_t quantize_nearest(const QuantMap& map, double y);

// absmax[b] = max |x| over block b (elements [b * block, min(n, (b + 1) * block)));
// codes[i] = quantize_nearest(x[i] / absmax[b]), the zero code when absmax[b] is 0.
void quantize_blockwise(const QuantMap& map, const float* x, uint8_t* codes, float* absmax, int64_t n, int64_t block);
// x[i] = map[codes[i]] * absmax[b].
void dequantize_blockwise(const QuantMap& map, const uint8_t* codes, const float* absmax, float* x, int64_t n,
                          int64_t block);

// One step of 8-bit blockwise AdamW on one tensor (step is 1-based). Per block: dequantize m
// (signed map) and v (unsigned map); g = grad * grad_scale; m = b1 m + (1 - b1) g;
// v = b2 v + (1 - b2) g^2; the parameter takes PyTorch's AdamW update from these unquantized
// moments; then m and v are requantized with their new block absmax.
void adamw8bit(float* param, const float* grad, uint8_t* m_codes, uint8_t* v_codes, float* m_absmax, float* v_absmax,
               int64_t n, int64_t block, double lr, double beta1, double beta2, double eps, double weight_decay,
               int64_t step, double grad_scale);

// sqrt of the sum of squares of every element of every tensor.
double global_norm(const std::vector<const float*>& tensors, const std::vector<int64_t>& numel);

}  // namespace memfit::ref
