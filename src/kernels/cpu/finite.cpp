// check_finite (see finite.hpp). The subtle point is the reduction across threads: each
// thread ORs what it found into an atomic flag once, at the end of its slice, so there is no
// per-thread buffer and the answer does not depend on the thread count.
#include "kernels/cpu/finite.hpp"

#include <algorithm>

#include "core/error.hpp"
#include "core/half.hpp"
#include "kernels/cpu/parallel.hpp"

namespace memfit {
namespace {

template <class T>
bool scan(const T* x, int64_t begin, int64_t end) {
  int any = 0;
#pragma omp simd reduction(| : any)
  for (int64_t i = begin; i < end; ++i) any |= int(non_finite(x[i]));
  return any != 0;
}

bool scan_span(const FiniteSpan& s, int64_t begin, int64_t end) {
  switch (s.dtype) {
    case DType::f32: return scan(static_cast<const float*>(s.data), begin, end);
    case DType::bf16: return scan(static_cast<const bf16_t*>(s.data), begin, end);
    case DType::f16: return scan(static_cast<const fp16_t*>(s.data), begin, end);
    default: MEMFIT_ASSERT(false, "check_finite over a {} tensor", dtype_name(s.dtype));
  }
}

}  // namespace

bool any_non_finite(const void* x, DType dtype, int64_t n) { return scan_span(FiniteSpan{x, dtype, n}, 0, n); }

FiniteCheck::FiniteCheck(std::vector<FiniteSpan> spans) : spans_(std::move(spans)) {
  offsets_.assign(spans_.size() + 1, 0);
  for (size_t i = 0; i < spans_.size(); ++i) {
    MEMFIT_CHECK(dtype_is_float(spans_[i].dtype) && spans_[i].dtype != DType::nf4, "kernels",
                 "check_finite over a {} tensor", dtype_name(spans_[i].dtype));
    offsets_[i + 1] = offsets_[i] + spans_[i].numel;
  }
}

bool FiniteCheck::run() const {
  std::atomic<int> found{0};
  const FiniteSpan* spans = spans_.data();
  const int64_t* offsets = offsets_.data();
  const int64_t count = int64_t(spans_.size());
  parallel_for(offsets_.back(), kParallelGrain, [&, spans, offsets, count](int64_t lo, int64_t hi) {
    bool any = false;
    int64_t i = std::upper_bound(offsets, offsets + count + 1, lo) - offsets - 1;
    for (int64_t pos = lo; pos < hi && i < count && !any; ++i) {
      const int64_t begin = pos - offsets[i], end = std::min(hi, offsets[i + 1]) - offsets[i];
      any = scan_span(spans[i], begin, end);
      pos = offsets[i] + end;
    }
    if (any) found.store(1, std::memory_order_relaxed);
  });
  return found.load(std::memory_order_relaxed) != 0;
}

}  // namespace memfit
