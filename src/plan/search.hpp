// Searching plans: the largest value of a knob (micro-batch, sequence length, chunk rows) for
// which a candidate's plan fits, given a predicate that builds and plans the candidate. The
// predicate is assumed monotone (fits up to some value, not after): memory grows with batch
// and sequence length. It probes upward by doubling from `lo`, then bisects, so it plans
// O(log answer) candidates, and it remembers every answer so no candidate is planned twice.
#pragma once

#include <cstdint>
#include <functional>
#include <map>

namespace memfit {

class FitSearch {
 public:
  explicit FitSearch(std::function<bool(int64_t)> fits) : fits_(std::move(fits)) {}
  // Largest v in [lo, hi] with fits(v); lo - 1 when fits(lo) is false.
  int64_t largest(int64_t lo, int64_t hi);
  bool fits(int64_t v);            // memoised predicate
  int probes() const { return int(seen_.size()); }

 private:
  std::function<bool(int64_t)> fits_;
  std::map<int64_t, bool> seen_;
};

}  // namespace memfit
