// QuantCodec: codes <-> values of one 256-entry quantization map (kernels/quant_map.hpp) at
// the speed an optimizer pass needs. Decoding is a table lookup. Encoding finds the nearest
// entry without a search: the float's sign, exponent and top mantissa bits select a bucket
// of the value range, and one table entry per bucket holds the code at the bucket's lower
// end and the low mantissa bits of the one midpoint inside the bucket, if any; comparing
// those bits with the value's own finishes (within a bucket, floats compare as their low
// bits do). One gather per 16 values.
//
// Subtle point: this is exact only if no bucket holds two midpoints, and the two clamped
// buckets (below 2^-k, and [1, inf)) hold none. The constructor picks the coarsest bucket
// width for which that holds (it checks every bucket), so the encoder returns the nearest
// entry of the map, deciding at the midpoints rounded to float (a value exactly on one goes
// to the lower code).
#pragma once

#include <bit>
#include <cstdint>
#include <vector>

#include "kernels/quant_map.hpp"

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace memfit {

class QuantCodec {
 public:
  explicit QuantCodec(const QuantMap& map);

  float decode(uint8_t code) const { return map_[code]; }

  uint8_t encode(float y) const {
    const uint32_t bits = std::bit_cast<uint32_t>(y), magnitude = bits & 0x7fffffffu, negative = bits >> 31;
    int32_t bucket = int32_t(magnitude >> shift_) - base_;
    bucket = bucket < 0 ? 0 : bucket > top_ ? top_ : bucket;
    const uint32_t entry = entries_[size_t(negative * uint32_t(top_ + 1) + uint32_t(bucket))];
    const uint32_t low = magnitude & low_mask_, midpoint_low = entry & kLowBits;
    // Above the midpoint: a larger magnitude for positive values, a smaller one for negative.
    const bool above = negative ? low < midpoint_low : low > midpoint_low;
    return uint8_t((entry >> 24) + uint32_t(above));
  }

#if defined(__AVX512F__)
  __m512 decode16(const uint8_t* codes) const {
    const __m512i c = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(codes)));
    return _mm512_i32gather_ps(c, map_.data(), 4);
  }
  // The same codes as encode() on each lane.
  __m128i encode16(__m512 y) const {
    const __m512i bits = _mm512_castps_si512(y);
    const __m512i magnitude = _mm512_and_si512(bits, _mm512_set1_epi32(0x7fffffff));
    __m512i bucket = _mm512_sub_epi32(_mm512_srli_epi32(magnitude, shift_), _mm512_set1_epi32(base_));
    bucket = _mm512_min_epi32(_mm512_max_epi32(bucket, _mm512_setzero_si512()), _mm512_set1_epi32(top_));
    const __mmask16 negative = _mm512_movepi32_mask(bits);
    bucket = _mm512_mask_add_epi32(bucket, negative, bucket, _mm512_set1_epi32(top_ + 1));
    const __m512i entry = _mm512_i32gather_epi32(bucket, entries_.data(), 4);
    const __m512i low = _mm512_and_si512(magnitude, _mm512_set1_epi32(int(low_mask_)));
    const __m512i midpoint_low = _mm512_and_si512(entry, _mm512_set1_epi32(int(kLowBits)));
    const __mmask16 above = _mm512_mask_cmpgt_epu32_mask(__mmask16(~negative), low, midpoint_low) |
                            _mm512_mask_cmplt_epu32_mask(negative, low, midpoint_low);
    const __m512i lower = _mm512_srli_epi32(entry, 24);
    return _mm512_cvtepi32_epi8(_mm512_mask_add_epi32(lower, above, lower, _mm512_set1_epi32(1)));
  }
#endif

  int bucket_bits() const { return 23 - shift_; }  // mantissa bits that select a bucket
  int buckets() const { return 2 * (top_ + 1); }

 private:
  static constexpr uint32_t kLowBits = 0xffffff;  // an entry: code << 24 | midpoint's low bits
  bool build(int mantissa_bits, int min_exponent);

  QuantMap map_;
  QuantMap upper_;  // upper_[c]: midpoint between entries c and c + 1; upper_[255] = +inf
  int shift_ = 0, base_ = 0, top_ = 0;
  uint32_t low_mask_ = 0;         // the mantissa bits below a bucket's
  std::vector<uint32_t> entries_;  // [sign][bucket]
};

// Codecs of the signed (first moment) and unsigned (second moment) dynamic maps, built once.
const QuantCodec& signed_codec();
const QuantCodec& unsigned_codec();

// Blockwise quantization of n values: absmax[b] = max |x| over block b, codes[i] =
// encode(x[i] / absmax[b]) (the zero code for an all-zero block); and its inverse.
void quantize_blockwise(const QuantCodec& codec, const float* x, uint8_t* codes, float* absmax, int64_t n,
                        int64_t block);
void dequantize_blockwise(const QuantCodec& codec, const uint8_t* codes, const float* absmax, float* x, int64_t n,
                          int64_t block);

}  // namespace memfit
