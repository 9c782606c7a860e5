// Helpers shared by the kernel tests: seeded random data and the normalised error metric.
#pragma once

#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <random>
#include <vector>

namespace memfit::test {

template <class F = float>
std::vector<F> random_vector(size_t n, uint32_t seed, double lo = -1.0, double hi = 1.0) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<double> dist(lo, hi);
  std::vector<F> v(n);
  for (auto& x : v) x = F(dist(gen));
  return v;
}

inline std::vector<int32_t> random_ints(size_t n, int32_t bound, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int32_t> dist(0, bound - 1);
  std::vector<int32_t> v(n);
  for (auto& x : v) x = dist(gen);
  return v;
}

// max|a - b| / max|b|: an error relative to the scale of the expected tensor, so that
// near-zero elements (common in gradients) are not judged by their own tiny magnitude.
template <class A, class B>
double normalized_error(const A* a, const B* b, size_t n) {
  double diff = 0, scale = 0;
  for (size_t i = 0; i < n; ++i) {
    diff = std::max(diff, std::fabs(double(a[i]) - double(b[i])));
    scale = std::max(scale, std::fabs(double(b[i])));
  }
  return scale > 0 ? diff / scale : diff;
}

template <class A, class B>
double normalized_error(const std::vector<A>& a, const std::vector<B>& b) {
  EXPECT_EQ(a.size(), b.size());
  return normalized_error(a.data(), b.data(), std::min(a.size(), b.size()));
}

template <class T>
std::vector<double> to_double(const std::vector<T>& v) {
  return std::vector<double>(v.begin(), v.end());
}

// Finite differences for checking the references' backward in double: h = 1e-5 puts the
// truncation error near 1e-10 and rounding near 1e-11, so kGradTol = 1e-7 is a wide margin
// while a wrong term shows up at order 1.
inline constexpr double kGradStep = 1e-5;
inline constexpr double kGradTol = 1e-7;

inline double dot(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

// d objective / d x[i] for every i by central differences (x is restored afterwards).
inline std::vector<double> numeric_grad(std::vector<double>& x, const std::function<double()>& objective) {
  std::vector<double> g(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const double saved = x[i];
    x[i] = saved + kGradStep;
    const double up = objective();
    x[i] = saved - kGradStep;
    const double down = objective();
    x[i] = saved;
    g[i] = (up - down) / (2 * kGradStep);
  }
  return g;
}

// Index of the first element whose bits differ, or -1 (sizes must match).
inline int64_t first_bit_difference(const std::vector<float>& a, const std::vector<float>& b) {
  for (size_t i = 0; i < a.size(); ++i)
    if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0) return int64_t(i);
  return -1;
}

inline uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

// Runs fn with 1, 2 and 3 OpenMP threads and checks that the float buffers it fills are
// bitwise equal each time. A failure says how many elements differ and shows the first in both
// runs: one ulp in every row reads as a summation order, scattered garbage as a race.
inline void expect_thread_count_independent(const std::function<std::vector<std::vector<float>>()>& fn) {
  const int saved = omp_get_max_threads();
  omp_set_num_threads(1);
  const std::vector<std::vector<float>> one = fn();
  for (int threads : {2, 3}) {
    omp_set_num_threads(threads);
    const std::vector<std::vector<float>> many = fn();
    ASSERT_EQ(one.size(), many.size());
    for (size_t i = 0; i < one.size(); ++i) {
      if (one[i].size() != many[i].size()) {
        ADD_FAILURE() << "buffer " << i << " has " << many[i].size() << " elements with " << threads << " threads";
        continue;
      }
      const int64_t at = first_bit_difference(one[i], many[i]);
      if (at < 0) continue;
      int64_t count = 0;
      for (size_t k = size_t(at); k < one[i].size(); ++k) count += float_bits(one[i][k]) != float_bits(many[i][k]);
      ADD_FAILURE() << "buffer " << i << " differs with " << threads << " threads: " << count << " of "
                    << one[i].size() << " elements, first [" << at << "] = " << std::hexfloat << one[i][size_t(at)]
                    << " (1 thread) vs " << many[i][size_t(at)] << std::defaultfloat;
    }
  }
  omp_set_num_threads(saved);
}

}  // namespace memfit::test
