// A small deterministic generator (splitmix64) for initialisation, shuffling and the
// synthetic corpus: the same seed gives the same bytes on every machine and compiler,
// which std::normal_distribution does not promise.
#pragma once

#include <cmath>
#include <cstdint>
#include <string_view>

namespace memfit {

class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  uint64_t next() {
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  double uniform() { return double(next() >> 11) * 0x1.0p-53; }  // [0, 1)
  uint64_t below(uint64_t n) { return next() % n; }
  // Standard normal by Box-Muller (one value per call; simple and exactly reproducible).
  double normal() {
    const double u1 = (double(next() >> 11) + 1.0) * 0x1.0p-53;  // (0, 1]
    const double u2 = uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }

 private:
  uint64_t state_;
};

// Seed derived from a base seed and a name (FNV-1a), so each parameter's values do not
// depend on the order parameters are initialised in.
inline uint64_t derive_seed(uint64_t seed, std::string_view name) {
  uint64_t h = 1469598103934665603ull ^ seed;
  for (char c : name) h = (h ^ uint8_t(c)) * 1099511628211ull;
  return h;
}

}  // namespace memfit
