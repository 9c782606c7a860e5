#include "kernels/cpu/quant_codec.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/error.hpp"

namespace memfit {

QuantCodec::QuantCodec(const QuantMap& map) : map_(map) {
  for (int c = 0; c + 1 < kQuantMapSize; ++c) {
    MEMFIT_ASSERT(map[size_t(c)] < map[size_t(c + 1)], "quantization map not strictly ascending at {}", c);
    upper_[size_t(c)] = float((double(map[size_t(c)]) + double(map[size_t(c + 1)])) / 2);
  }
  upper_[kQuantMapSize - 1] = std::numeric_limits<float>::infinity();
  // Bucket 0 holds every magnitude below 2^-min_exponent: below half the smallest non-zero
  // midpoint magnitude, so it holds at most the midpoint next to zero.
  float smallest = 1;
  for (int c = 0; c + 1 < kQuantMapSize; ++c)
    if (upper_[size_t(c)] != 0) smallest = std::min(smallest, std::fabs(upper_[size_t(c)]));
  const int min_exponent = int(std::ceil(-std::log2(double(smallest)))) + 1;
  for (int bits = 2; bits <= 12; ++bits)
    if (build(bits, min_exponent)) return;
  MEMFIT_ASSERT(false, "no bucket width separates the midpoints of this quantization map");
}

bool QuantCodec::build(int mantissa_bits, int min_exponent) {
  shift_ = 23 - mantissa_bits;
  low_mask_ = (1u << shift_) - 1;
  base_ = int(std::bit_cast<uint32_t>(std::ldexp(1.0f, -min_exponent)) >> shift_) - 1;
  top_ = int(std::bit_cast<uint32_t>(1.0f) >> shift_) - base_;  // the bucket of [1, inf)
  const int per_side = top_ + 1;
  entries_.assign(size_t(2 * per_side), 0);
  auto magnitude = [&](int bucket) {  // lower end of a bucket's magnitudes
    if (bucket == 0) return 0.0f;
    return std::bit_cast<float>(uint32_t(base_ + bucket) << shift_);
  };
  auto low_bits = [&](float t) { return std::bit_cast<uint32_t>(std::fabs(t)) & low_mask_; };
  const float* u = upper_.data();
  const int midpoints = kQuantMapSize - 1;
  for (int b = 0; b < per_side; ++b) {
    const bool clamped = b == 0 || b == top_;  // spans several binades: its low bits say nothing
    const float s = magnitude(b);
    const float e = b == top_ ? std::numeric_limits<float>::infinity() : magnitude(b + 1);
    // Positive y in [s, e): code = #{midpoints < y}; the sentinel low_mask_ is never exceeded.
    const int below_s = int(std::lower_bound(u, u + midpoints, s) - u);
    const int below_e = int(std::lower_bound(u, u + midpoints, e) - u);
    if (below_e - below_s > 1 || (clamped && below_e > below_s)) return false;
    entries_[size_t(b)] = uint32_t(below_s) << 24 | (below_e > below_s ? low_bits(u[below_s]) : low_mask_);
    // Negative y in (-e, -s]: start from #{midpoints <= -e}; the sentinel 0 is never undercut.
    const int upto_neg_e = int(std::upper_bound(u, u + midpoints, -e) - u);
    const int upto_neg_s = int(std::upper_bound(u, u + midpoints, -s) - u);
    if (upto_neg_s - upto_neg_e > 1 || (clamped && upto_neg_s > upto_neg_e)) return false;
    entries_[size_t(per_side + b)] =
        uint32_t(upto_neg_e) << 24 | (upto_neg_s > upto_neg_e ? low_bits(u[upto_neg_e]) : 0u);
  }
  return true;
}

void quantize_blockwise(const QuantCodec& codec, const float* x, uint8_t* codes, float* absmax, int64_t n,
                        int64_t block) {
  for (int64_t begin = 0; begin < n; begin += block) {
    const int64_t end = std::min(n, begin + block);
    float amax = 0;
    for (int64_t i = begin; i < end; ++i) amax = std::max(amax, std::fabs(x[i]));
    absmax[begin / block] = amax;
    const float inv = amax > 0 ? 1.0f / amax : 0.0f;
    for (int64_t i = begin; i < end; ++i) codes[i] = codec.encode(x[i] * inv);
  }
}

void dequantize_blockwise(const QuantCodec& codec, const uint8_t* codes, const float* absmax, float* x, int64_t n,
                          int64_t block) {
  for (int64_t i = 0; i < n; ++i) x[i] = codec.decode(codes[i]) * absmax[i / block];
}

const QuantCodec& signed_codec() {
  static const QuantCodec codec(dynamic_map_signed());
  return codec;
}

const QuantCodec& unsigned_codec() {
  static const QuantCodec codec(dynamic_map_unsigned());
  return codec;
}

}  // namespace memfit
