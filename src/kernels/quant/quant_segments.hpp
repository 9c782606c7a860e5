// A quantised weight stored as pieces of rows (segments), each quantised on its own as the HF
// tensor it came from: Llama's fused q/k/v weight is q_proj, k_proj and v_proj, and bnb
// quantises each one separately (its own partial last block and double-quantisation offset).
// The pieces are concatenated, in row order, in each storage tensor:
//   codes    the pieces' packed codes (every piece has an even element count, so a 4-bit piece
//            starts on a byte);
//   scales   fp32 absmax per block, or (double quantisation) one uint8 code per block;
//   scales2  double quantisation: fp32 per 256 blocks of each piece;
//   offset   double quantisation: one fp32 per piece.
// A plain weight is one segment. Tiles of a dequantising product never straddle two pieces.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "kernels/quant/quant_format.hpp"

namespace memfit {

// segmented_quant_storage(): graph/quant_layout.hpp.

// The raw storage of a segmented weight (addresses of its tensors).
struct SegmentedStorage {
  const uint8_t* codes = nullptr;
  const void* scales = nullptr;  // float, or uint8 codes under double quantisation
  const float* scales2 = nullptr;
  const float* offset = nullptr;
};

// Where piece s starts in each storage tensor (bytes: codes, absmax = scales, absmax2 = scales2).
QuantStorage segment_offset(const QuantSpec& spec, int64_t cols, const std::vector<int64_t>& segments, size_t s);

// Read-only view of piece s.
QuantizedWeight segment_weight(const QuantSpec& spec, int64_t cols, const std::vector<int64_t>& segments, size_t s,
                               const SegmentedStorage& storage);

// Quantises `values` ([sum(segments), cols] row-major, float or bf16_t) into the storage spans,
// piece by piece, as bnb's quantize_4bit (with compress_statistics) or memfit's blockwise int8.
// `absmax_staging` holds one float per block of the largest piece (double quantisation only).
template <class T>
void quantize_segments(std::span<const T> values, const QuantSpec& spec, int64_t cols,
                       const std::vector<int64_t>& segments, std::span<uint8_t> codes, std::span<uint8_t> scales,
                       std::span<float> scales2, std::span<float> offset, std::span<float> absmax_staging);

// Blocks of the largest piece (the staging quantize_segments needs under double quantisation).
int64_t max_segment_blocks(const QuantSpec& spec, int64_t cols, const std::vector<int64_t>& segments);

}  // namespace memfit
