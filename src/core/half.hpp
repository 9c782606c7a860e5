// 16-bit float storage types and their conversions to and from fp32 (CPU kernels, weight
// loading and saving). Every kernel computes in fp32: it widens what it loads and narrows
// once when it stores, so a kernel templated over the storage type is the fp32 kernel, bit
// for bit, when T = float.
//
// Subtle point: narrowing to bf16 rounds to nearest even and flushes fp32 subnormals to a
// signed zero, which is what AVX512-BF16's vcvtneps2bf16 does (and therefore what oneDNN's
// bf16 outputs are): a value narrowed by a memfit loop and the same value written by a oneDNN
// product agree bit for bit. NaNs stay NaNs (quieted). fp16 narrowing is IEEE round to
// nearest even with subnormals and overflow to infinity, and NaN payloads are kept, bit for
// bit what F16C's vcvtps2ph / vcvtph2ps do. Both conversions are integer and select
// operations only, because GCC 12 vectorizes neither _Float16 conversions nor branches:
// written this way every kernel loop over 16-bit data stays a vector loop.
#pragma once

#include <bit>
#include <cstdint>

#include "core/dtype.hpp"

namespace memfit {

struct bf16_t {
  uint16_t bits;
};
struct fp16_t {
  uint16_t bits;
};

// The storage type of a DType (float for f32).
template <DType D>
struct StorageOf;
template <>
struct StorageOf<DType::f32> {
  using type = float;
};
template <>
struct StorageOf<DType::bf16> {
  using type = bf16_t;
};
template <>
struct StorageOf<DType::f16> {
  using type = fp16_t;
};

// c ? a : b as mask arithmetic: GCC turns a ternary next to floating-point work into a
// branch, which stops the loop from vectorizing.
inline uint32_t select_bits(bool c, uint32_t a, uint32_t b) {
  const uint32_t mask = 0u - uint32_t(c);
  return (a & mask) | (b & ~mask);
}

inline float widen(float x) { return x; }
inline float widen(bf16_t x) { return std::bit_cast<float>(uint32_t(x.bits) << 16); }
inline float widen(fp16_t x) {
  const uint32_t sign = uint32_t(x.bits & 0x8000u) << 16;
  const uint32_t magnitude = x.bits & 0x7fffu;
  // Normal: move exponent and mantissa into place and rebias the exponent (15 -> 127).
  uint32_t r = (magnitude << 13) + ((127u - 15u) << 23);
  // Subnormal: magnitude * 2^-24, exact in fp32 (an integer below 2^10 times a power of two).
  const uint32_t sub = std::bit_cast<uint32_t>(float(int32_t(magnitude)) * 0x1p-24f);
  r = select_bits(magnitude < 0x0400u, sub, r);
  // Infinity or NaN: all exponent bits set; NaNs quieted (bit 22), payload kept.
  const uint32_t special = (magnitude << 13) | 0x7f800000u | (uint32_t((magnitude & 0x03ffu) != 0) << 22);
  r = select_bits(magnitude >= 0x7c00u, special, r);
  return std::bit_cast<float>(r | sign);
}

template <class T>
inline T narrow(float x);
template <>
inline float narrow<float>(float x) {
  return x;
}
template <>
inline bf16_t narrow<bf16_t>(float x) {
  const uint32_t u = std::bit_cast<uint32_t>(x);
  const uint32_t magnitude = u & 0x7fffffffu;
  uint32_t r = u + 0x7fffu + ((u >> 16) & 1u);                       // round to nearest, ties to even
  r = select_bits(magnitude > 0x7f800000u, u | 0x00400000u, r);       // NaN: quiet, payload's top kept
  r = select_bits(magnitude < 0x00800000u, u & 0x80000000u, r);       // subnormal: signed zero
  return bf16_t{uint16_t(r >> 16)};
}
template <>
inline fp16_t narrow<fp16_t>(float x) {
  const uint32_t u = std::bit_cast<uint32_t>(x);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const uint32_t magnitude = u & 0x7fffffffu;
  // Normal results (|x| >= 2^-14): rebias the exponent (127 -> 15) and round the 13 dropped
  // mantissa bits to nearest even by integer addition; a carry that reaches exponent 31
  // gives infinity, as it should for |x| >= 65520.
  const uint32_t normal = (magnitude - ((127u - 15u) << 23) + 0x0fffu + ((magnitude >> 13) & 1u)) >> 13;
  // Subnormal results: adding 0.5 aligns |x| to the fp16 subnormal grid (2^-24 per step,
  // the last mantissa bit of 0.5 + tiny), so the FPU rounds it to nearest even; the low bits
  // of the sum are then the fp16 mantissa.
  const uint32_t sub = std::bit_cast<uint32_t>(std::bit_cast<float>(magnitude) + 0.5f) - 0x3f000000u;
  uint32_t r = select_bits(magnitude < 0x38800000u, sub, normal);
  r = select_bits(magnitude >= 0x47800000u, 0x7c00u, r);  // |x| >= 2^16: infinity
  r = select_bits(magnitude > 0x7f800000u, 0x7e00u | ((magnitude >> 13) & 0x03ffu), r);  // NaN: quiet, payload kept
  return fp16_t{uint16_t(r | sign)};
}

// Non-finite (inf or NaN) test on the stored bits: the exponent field is all ones.
inline bool non_finite(float x) { return (std::bit_cast<uint32_t>(x) & 0x7f800000u) == 0x7f800000u; }
inline bool non_finite(bf16_t x) { return (x.bits & 0x7f80u) == 0x7f80u; }
inline bool non_finite(fp16_t x) { return (x.bits & 0x7c00u) == 0x7c00u; }

// Calls fn with a value of the storage type of `t` (f32, bf16 or f16); false for other types.
template <class Fn>
bool visit_float_type(DType t, Fn&& fn) {
  switch (t) {
    case DType::f32: fn(float{}); return true;
    case DType::bf16: fn(bf16_t{}); return true;
    case DType::f16: fn(fp16_t{}); return true;
    default: return false;
  }
}

}  // namespace memfit
