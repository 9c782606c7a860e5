// Marks the span of a call into a third-party library (oneDNN in the kernels, MPI in dist/).
// memfit's own code allocates nothing inside a step; such libraries build small bookkeeping
// objects on the heap and free them before returning. Callers wrap those calls in a
// LibraryCallScope so the allocation-counting test can hold memfit to zero and the library to
// "freed before return". It lives in core because every piece that calls a library (kernels,
// dist) may use it. The counter is process-wide because the library's worker threads allocate
// too, and no memfit kernel runs concurrently with a library call.
#pragma once

#include <atomic>

namespace memfit {

class LibraryCallScope {
 public:
  LibraryCallScope() { depth_.fetch_add(1, std::memory_order_relaxed); }
  ~LibraryCallScope() { depth_.fetch_sub(1, std::memory_order_relaxed); }
  LibraryCallScope(const LibraryCallScope&) = delete;
  LibraryCallScope& operator=(const LibraryCallScope&) = delete;
  static bool active() { return depth_.load(std::memory_order_relaxed) > 0; }

 private:
  static inline std::atomic<int> depth_{0};
};

}  // namespace memfit
