// QuantCodec: codes <-> values of one 256-entry quantization map (kernels/quant_map.hpp) at
// the speed an optimizer pass needs. Decoding is a table lookup. Encoding finds the nearest
// entry without a search: the float's sign, exponent and top mantissa bits select a bucket
// of the value range, a table gives the code at the bucket's lower end, and one comparison
// with the midpoint above that code finishes.
//
// Subtle point: this is exact only if no bucket holds two midpoints. The constructor picks
// the coarsest bucket width for which that holds (it checks every bucket), so the encoder
// returns what an exhaustive nearest-entry search over the map returns, for every float
// (ties, a value exactly on a midpoint, go to the lower code).
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
    const uint32_t bits = std::bit_cast<uint32_t>(y);
    int32_t bucket = int32_t((bits & 0x7fffffffu) >> shift_) - base_;
    bucket = bucket < 0 ? 0 : bucket > top_ ? top_ : bucket;
    const int lower = first_[size_t((bits >> 31) * uint32_t(top_ + 1) + uint32_t(bucket))];
    return uint8_t(lower + (y > upper_[size_t(lower)]));
  }

#if defined(__AVX512F__)
  __m512 decode16(const uint8_t* codes) const {
    const __m512i c = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(codes)));
    return _mm512_i32gather_ps(c, map_.data(), 4);
  }
  // The same codes as encode() on each lane.
  __m128i encode16(__m512 y) const {
    const __m512i bits = _mm512_castps_si512(y);
    __m512i bucket = _mm512_sub_epi32(_mm512_srli_epi32(_mm512_and_si512(bits, _mm512_set1_epi32(0x7fffffff)), shift_),
                                      _mm512_set1_epi32(base_));
    bucket = _mm512_min_epi32(_mm512_max_epi32(bucket, _mm512_setzero_si512()), _mm512_set1_epi32(top_));
    const __mmask16 negative = _mm512_movepi32_mask(bits);
    bucket = _mm512_mask_add_epi32(bucket, negative, bucket, _mm512_set1_epi32(top_ + 1));
    // Byte table read as 32-bit lanes at byte offsets (the table has 3 bytes of padding).
    const __m512i lower =
        _mm512_and_si512(_mm512_i32gather_epi32(bucket, first_.data(), 1), _mm512_set1_epi32(0xff));
    const __m512 upper = _mm512_i32gather_ps(lower, upper_.data(), 4);
    const __mmask16 above = _mm512_cmp_ps_mask(y, upper, _CMP_GT_OQ);
    return _mm512_cvtepi32_epi8(_mm512_mask_add_epi32(lower, above, lower, _mm512_set1_epi32(1)));
  }
#endif

  int bucket_bits() const { return 23 - shift_; }  // mantissa bits that select a bucket
  int buckets() const { return 2 * (top_ + 1); }

 private:
  bool build(int mantissa_bits, int min_exponent);

  QuantMap map_;
  QuantMap upper_;  // upper_[c]: midpoint between entries c and c + 1; upper_[255] = +inf
  int shift_ = 0, base_ = 0, top_ = 0;
  std::vector<uint8_t> first_;  // [sign][bucket]: the code of the bucket's lower end, + 3 bytes of padding
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
