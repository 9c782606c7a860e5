// Checked integer arithmetic for sizes: element counts, byte counts, parameter counts,
// offsets and plan totals. Every size memfit derives from its input (model shape, batch,
// sequence length) goes through these, so an absurd input becomes a one-line error naming the
// quantity ("[model] parameters: 1073741824 x 3221225472 overflows 64-bit integers") instead of
// a wrapped figure, a negative extent, or a signal inside a library.
//
// The bounds below are the ones every size is validated against before a program is built
// (ModelSpec::validate, the policy checks of build_training_program) and after it is planned
// (plan_memory): any real model and run stays far inside them.
#pragma once

#include <cstdint>
#include <limits>
#include <string_view>
#include <type_traits>

namespace memfit {

// The largest extent of any matrix dimension memfit multiplies (rows = batch x sequence,
// channels, MLP width, padded vocabulary, context length). oneDNN 2.6's brgemm kernels, which
// run memfit's matmuls, keep M, N, K and the leading dimensions LDA/LDB/LDC as `int` (brgemm_t
// in src/cpu/x64/brgemm/brgemm_types.hpp); batch x sequence = 2^32 truncates to 0 there and
// divides by zero (SIGFPE). memfit's own kernels index with int64_t.
inline constexpr int64_t kMaxKernelDim = std::numeric_limits<int32_t>::max();

// The most bytes one memory tier of one rank may plan: 1 PiB. The largest shared-memory
// machines hold tens of TiB, so a plan above this is a mistake in the input; and because every
// tier total stays below 2^50, sums of a few tiers or a few plans never come near 2^63.
inline constexpr uint64_t kMaxTierBytes = uint64_t(1) << 50;

// Throws memfit::Error("[piece] what: a op b overflows N-bit integers").
[[noreturn]] void throw_overflow(std::string_view piece, std::string_view what, std::string_view a, char op,
                                 std::string_view b, int bits);

namespace detail {
template <class T>
std::string_view decimal(T v, char (&buf)[24]);
}  // namespace detail

// a * b, or a [piece] error naming `what` when the product does not fit T.
template <class T>
T checked_mul(T a, T b, std::string_view what, std::string_view piece = "size") {
  static_assert(std::is_integral_v<T>);
  T r;
  if (__builtin_mul_overflow(a, b, &r)) [[unlikely]] {
    char ba[24], bb[24];
    throw_overflow(piece, what, detail::decimal(a, ba), 'x', detail::decimal(b, bb), int(sizeof(T) * 8));
  }
  return r;
}

// a + b, or a [piece] error naming `what` when the sum does not fit T.
template <class T>
T checked_add(T a, T b, std::string_view what, std::string_view piece = "size") {
  static_assert(std::is_integral_v<T>);
  T r;
  if (__builtin_add_overflow(a, b, &r)) [[unlikely]] {
    char ba[24], bb[24];
    throw_overflow(piece, what, detail::decimal(a, ba), '+', detail::decimal(b, bb), int(sizeof(T) * 8));
  }
  return r;
}

// x rounded up to a multiple of `alignment` (> 0), checked.
uint64_t checked_align_up(uint64_t x, uint64_t alignment, std::string_view what, std::string_view piece = "size");

// A non-negative int64_t as uint64_t, or a [piece] error naming `what` when it is negative.
uint64_t checked_unsigned(int64_t v, std::string_view what, std::string_view piece = "size");

}  // namespace memfit
