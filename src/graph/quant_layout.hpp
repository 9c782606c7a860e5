// The storage layout of quantised frozen weights (QLoRA): formats, block sizes and the bytes
// of each stored part, as bitsandbytes (0.50) lays them out (kernels/quant/quant_format.hpp
// has the codes themselves). The program's planner sizes quantised parameters from here, so
// it sits in graph/, below the kernels that fill the bytes.
//   nf4 / fp4  blockwise over the flattened tensor (block 32..4096, a power of two; 64 by
//              default), one fp32 absmax per block, two 4-bit codes per byte, the last block
//              partial when the size is not a multiple of the block;
//   double quantisation (bnb's compress_statistics): one uint8 code per block, an fp32 absmax
//              per 256 blocks and one fp32 offset per tensor;
//   int8       blockwise absmax, one byte per element.
// A weight may be stored as pieces of rows (segments), each quantised on its own as the HF
// tensor it came from (Llama's fused q/k/v weight is q_proj, k_proj and v_proj).
#pragma once

#include <cstdint>
#include <vector>

namespace memfit {

enum class QuantKind : uint8_t { nf4, fp4, int8 };
const char* quant_kind_name(QuantKind kind);

inline constexpr int64_t kDefaultQuantBlock = 64;    // bitsandbytes' default
inline constexpr int64_t kDoubleQuantBlock = 256;    // blocks of absmax values per second-level absmax
inline constexpr int64_t kMinQuantBlock = 32, kMaxQuantBlock = 4096;

struct QuantSpec {
  QuantKind kind = QuantKind::nf4;
  int64_t block = kDefaultQuantBlock;
  bool double_quant = false;  // 4-bit kinds only
};

// Throws [kernels] unless the block is a power of two in [32, 4096] (what bnb accepts) and
// double quantisation is asked only of a 4-bit kind.
void check_quant_spec(const QuantSpec& spec);

inline int64_t quant_blocks(int64_t numel, int64_t block) { return (numel + block - 1) / block; }

// Bytes of each part of a quantised tensor of numel elements.
struct QuantStorage {
  uint64_t codes = 0;          // packed codes: ceil(numel / 2) for 4-bit, numel for int8
  uint64_t absmax = 0;         // fp32 per block, or (double quant) one uint8 code per block
  uint64_t absmax2 = 0;        // double quant: fp32 per 256 blocks
  uint64_t offset = 0;         // double quant: the fp32 mean subtracted before quantising
  uint64_t total() const { return codes + absmax + absmax2 + offset; }
};
QuantStorage quant_storage(const QuantSpec& spec, int64_t numel);

// Bits per parameter of a tensor large enough that the per-tensor offset and the partial last
// blocks vanish: 4 + 32/block for nf4/fp4, 4 + 8/block + 32/(256 block) with double
// quantisation (4.127 at block 64), 8 + 32/block for int8.
double quant_bits_per_parameter(const QuantSpec& spec);

// Bytes of each storage part of a [sum(segments), cols] weight: the sums over the pieces.
// Throws [kernels] when a 4-bit piece has an odd element count or the segments are empty.
QuantStorage segmented_quant_storage(const QuantSpec& spec, int64_t cols, const std::vector<int64_t>& segments);

}  // namespace memfit
