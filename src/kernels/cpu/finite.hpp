// check_finite: whether any element of a set of tensors (fp32, bf16 or fp16) is inf or NaN,
// the overflow test of dynamic loss scaling. One pass over the concatenation of all tensors,
// each thread taking a contiguous slice (like AdamW, see adamw.hpp), testing the exponent
// bits only: a handful of integer operations per element, no floating-point compares.
#pragma once

#include <atomic>
#include <cstdint>
#include <vector>

#include "core/dtype.hpp"

namespace memfit {

struct FiniteSpan {
  const void* data = nullptr;
  DType dtype = DType::f32;
  int64_t numel = 0;
};

// Whether x[0, n) holds an inf or a NaN.
bool any_non_finite(const void* x, DType dtype, int64_t n);

class FiniteCheck {
 public:
  explicit FiniteCheck(std::vector<FiniteSpan> spans);  // throws [kernels] for non-float spans
  bool run() const;  // allocates nothing

 private:
  std::vector<FiniteSpan> spans_;
  std::vector<int64_t> offsets_;  // offsets_[i] = elements before span i; size n + 1
};

}  // namespace memfit
