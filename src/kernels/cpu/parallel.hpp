// parallel_for: the one way the CPU kernels fork. [0, n) is split into one contiguous range
// per OpenMP thread (like schedule(static)) and body(begin, end) runs on each.
//
// Subtle point: libgomp caches the team of a multi-thread parallel region but mallocs and
// frees a fresh team for every region that runs on a single thread. A step must not
// allocate, so with one thread available — or less than `grain` items of work, where a fork
// costs more than it saves — the body runs inline on the calling thread and no region is
// opened at all. This is a header because the body is a lambda the compiler must inline and
// vectorize.
#pragma once

#include <omp.h>

#include <cstdint>

namespace memfit {

// Elementwise work below this many items is not worth waking the other threads for.
inline constexpr int64_t kParallelGrain = 16384;

template <class Body>
inline void parallel_for(int64_t n, int64_t grain, const Body& body) {
  if (n <= 0) return;
  if (n <= grain || omp_get_max_threads() <= 1) {
    body(int64_t(0), n);
    return;
  }
#pragma omp parallel
  {
    const int64_t threads = omp_get_num_threads(), t = omp_get_thread_num();
    const int64_t begin = n * t / threads, end = n * (t + 1) / threads;
    if (begin < end) body(begin, end);
  }
}

}  // namespace memfit
