#include "plan/search.hpp"

#include <algorithm>

namespace memfit {

bool FitSearch::fits(int64_t v) {
  auto it = seen_.find(v);
  if (it != seen_.end()) return it->second;
  const bool f = fits_(v);
  seen_[v] = f;
  return f;
}

int64_t FitSearch::largest(int64_t lo, int64_t hi) {
  if (hi < lo || !fits(lo)) return lo - 1;
  // Doubling: good = a value that fits, bad = one that does not (or hi + 1).
  int64_t good = lo, bad = hi + 1;
  for (int64_t step = 1; good < hi;) {
    const int64_t next = std::min(hi, good + step);
    if (!fits(next)) {
      bad = next;
      break;
    }
    good = next;
    step *= 2;
  }
  while (bad - good > 1) {
    const int64_t mid = good + (bad - good) / 2;
    (fits(mid) ? good : bad) = mid;
  }
  return good;
}

}  // namespace memfit
