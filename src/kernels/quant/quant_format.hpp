// Quantised frozen weights (QLoRA): the formats, their sizes, and read-only views of a
// quantised tensor. Formats are bitsandbytes' (0.50), so that memfit's codes equal
// bnb.functional.quantize_4bit's bit for bit:
//   nf4 / fp4  blockwise over the flattened tensor (block 32..4096, a power of two; 64 by
//              default), one fp32 absmax per block, two 4-bit codes per byte with the even
//              element in the high nibble, the last block partial when the size is not a
//              multiple of the block;
//   double quantisation (bnb's compress_statistics): the absmax values minus their mean (the
//              offset) are themselves quantised to 8 bits with bnb's dynamic map, blockwise in
//              blocks of 256 with an fp32 absmax per block;
//   int8       blockwise absmax, code = round-to-even(x * 127 / absmax) (bnb's row-wise int8
//              is the case block = row length).
// Invariant: a QuantizedWeight's spans have exactly the sizes quant_storage() gives for its
// spec and element count (check_quantized_weight() says so or throws [kernels]).
#pragma once

#include <array>
#include <cstdint>
#include <span>

#include "graph/quant_layout.hpp"
#include "kernels/quant_map.hpp"

namespace memfit {

// A quantised [rows, cols] weight, read-only. Blocks run over the flattened row-major tensor,
// so a block may straddle two rows.
struct QuantizedWeight {
  QuantSpec spec;
  int64_t rows = 0, cols = 0;
  std::span<const uint8_t> codes;
  std::span<const float> absmax;          // plain: one per block
  std::span<const uint8_t> absmax_codes;  // double quant: one per block
  std::span<const float> absmax2;         // double quant: one per 256 blocks
  float offset = 0.0f;                    // double quant
  int64_t numel() const { return rows * cols; }
  // The fp32 absmax of block b as bnb's dequantize_4bit computes it: plain, or
  // dynamic_map[code] * absmax2 + offset, each step rounded to fp32.
  float block_absmax(int64_t b) const;
};
void check_quantized_weight(const QuantizedWeight& w);  // sizes against quant_storage; throws [kernels]

// Code tables. nf4 and fp4 hold the value of each 4-bit code; the fp4 table has +0 (code 0)
// and -0 (code 8).
const std::array<float, 16>& nf4_code_values();
const std::array<float, 16>& fp4_code_values();
const std::array<float, 16>& code_values(QuantKind kind);  // nf4 or fp4

// bitsandbytes' signed dynamic map (create_dynamic_map(signed=True) as an fp32 tensor),
// ascending; it differs in the last bits from memfit's own dynamic_map_signed(), which is
// rounded once from double.
const QuantMap& bnb_dynamic_map_signed();

}  // namespace memfit
