// Blockwise quantise / dequantise of weights (formats in quant_format.hpp), bit for bit what
// bitsandbytes 0.50 computes on the CPU:
//   quantize_4bit    absmax = max |x| per block; s = clamp(x * (1 / max(absmax, 1e-38)), -1, 1),
//                    but s = x / max(absmax, 1e-38) in a partial last block (bnb's torch code
//                    divides there); the code is the number of sorted-table midpoints below s
//                    (a value on a midpoint takes the lower level), mapped back to bnb's code
//                    order (fp4: a value in (0, 1/384] gets code 8, the "-0" level, as bnb's).
//                    An odd element count pads the last byte with the code of 0.
//   double quant     offset = torch's fp32 mean of the absmax values (its summation order and
//                    thread split, torch_float_mean); each (absmax - offset) is coded with the dynamic map in
//                    blocks of 256 as bnb's CPU 8-bit kernel (quantize_dynamic_blockwise).
//   dequantise       code value * block absmax in fp32, then rounded to the output type
//                    (bf16: to nearest even). bnb 0.50 on an AVX-512 CPU picks one of three
//                    kernels by shape, and memfit reproduces each one's two quirks: fp4 code 8
//                    is +0 on its torch path (odd last dimension, or block >= 2048) and its
//                    AVX-512 path (last dimension a multiple of 16), -0 on its scalar path;
//                    bf16 subnormals are flushed to zero on the AVX-512 path only. (bnb's
//                    AVX-512 kernel also indexes absmax per row, which is wrong for a last
//                    dimension that is not a multiple of the block: there memfit decodes
//                    bnb's codes correctly and does not equal bnb's output.)
//   int8             absmax per block; code = round-to-even(x * ((1 / absmax) * 127)) (torch's
//                    127 / t is a reciprocal times 127); value = (code * absmax) * fl(1/127), as
//                    bnb's int8_vectorwise_quant / _dequant.
// All functions work on caller-provided spans and check sizes ([kernels]). They allocate
// nothing themselves; quantize_4bit's OpenMP region may build the thread team on first use.
#pragma once

#include <bit>
#include <cstdint>
#include <span>

#include "core/half.hpp"
#include "kernels/quant/quant_format.hpp"

namespace memfit {

// Codes and plain absmax of `in` (float or bf16_t) as nf4 or fp4 with spec.block; codes has
// ceil(n / 2) bytes, absmax one float per block.
template <class T>
void quantize_4bit(std::span<const T> in, const QuantSpec& spec, std::span<uint8_t> codes, std::span<float> absmax);

// bnb's quantize_blockwise (8-bit, dynamic map) of values - offset (fp32 subtraction), as its
// CPU kernel computes it: per block a = max |v| (fp32), then the code of clamp(v * (1 / a), -1,
// 1) from a table over 65536 points of [-1, 1] (the point is ((s + 1) * 0.5) * 65535 + 0.5,
// truncated): within ~1/65535 of a midpoint between two map entries this is not always the
// nearest entry, and it is still bnb's code. A block with a = 0 gets codes 0.
void quantize_dynamic_blockwise(std::span<const float> values, float offset, int64_t block, std::span<uint8_t> codes,
                                std::span<float> absmax);

// Double quantisation of plain absmax values: writes one code per value, one fp32 absmax per
// 256 values, and returns the offset. torch_threads: see torch_float_mean (it matters only
// above 32768 blocks, 2M parameters at block 64).
float double_quantize_absmax(std::span<const float> absmax, std::span<uint8_t> codes, std::span<float> absmax2,
                             int torch_threads = 1);

// int8 codes (int8 stored as uint8 bytes) and fp32 absmax per block. An all-zero block has
// absmax 0 and codes 0 (bnb divides by zero there).
template <class T>
void quantize_int8(std::span<const T> in, const QuantSpec& spec, std::span<uint8_t> codes, std::span<float> absmax);

// Elements [begin, end) of the flattened dequantised weight into out (end - begin elements of
// float or bf16_t). Any range works; a dequantising product asks for whole rows.
template <class T>
void dequantize_range(const QuantizedWeight& w, int64_t begin, int64_t end, std::span<T> out);

// torch.Tensor.mean() of a contiguous fp32 tensor on this machine's PyTorch CPU build (2.15):
// an fp32 sum in torch's order (8-lane vectors, 4 accumulators, a 4-level cascade), divided by
// n. Above 32768 values torch splits the sum over its threads, so its result depends on how
// many it ran on (torch.get_num_threads() where bnb quantised: the machine's cores unless set);
// torch_threads says which, and the result is bit-exact for that count.
float torch_float_mean(std::span<const float> values, int torch_threads = 1);

// Writes bf16 rounded to nearest even without flushing subnormals (torch's and bnb's rounding;
// memfit's narrow<bf16_t> flushes them, as the AVX512-BF16 instructions do).
inline bf16_t round_to_bf16(float x) {
  const uint32_t u = std::bit_cast<uint32_t>(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return bf16_t{uint16_t((u >> 16) | 0x40u)};  // NaN, quieted
  return bf16_t{uint16_t((u + 0x7fffu + ((u >> 16) & 1u)) >> 16)};
}

// A quantised product computed in fp32 for a model whose weights are 16-bit (an fp32 island:
// fp16 on the CPU, or a pinned --fp32-ops product) multiplies the dequantised weights rounded
// to that dtype, as a 16-bit plain program's fp32 island multiplies its stored weights (and as
// bitsandbytes dequantises into a weight of its compute dtype).
inline void round_to_weight_dtype(DType weights, std::span<float> tile) {
  if (weights == DType::bf16)
    for (float& v : tile) v = widen(narrow<bf16_t>(v));
  else if (weights == DType::f16)
    for (float& v : tile) v = widen(narrow<fp16_t>(v));
}

// Elements [begin, end) of w as fp32, equal to the values a quantised product whose weights are
// `weights` multiplies by: dequantised in bf16 (its narrowing, as the bf16 product's tile) for
// bf16, else in fp32 and rounded by round_to_weight_dtype. `scratch` holds end - begin bf16
// values (bf16 only).
void dequantize_as_weight(const QuantizedWeight& w, int64_t begin, int64_t end, DType weights,
                          std::span<bf16_t> scratch, std::span<float> out);

}  // namespace memfit
