// The skinny bf16 products (kernels/cpu/skinny_bf16.hpp) against a naive double-precision
// product of the same bf16 values, through MatmulKernel (which must route them there), for
// LoRA's forward and input-gradient shapes and odd edges: both layouts of B, tails of the 16-lane
// vectors and of the register blocks, accumulation, alpha, and bf16 or fp32 C.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "core/half.hpp"
#include "kernels/cpu/matmul.hpp"

namespace memfit {
namespace {

struct Case {
  int64_t m, n, k;
  bool trans_a, trans_b;
};

const DnnlEnv& env() {
  static const DnnlEnv e = DnnlEnv::make_cpu();
  return e;
}

std::vector<bf16_t> random_bf16(size_t n, uint32_t seed) {
  std::vector<bf16_t> v(n);
  uint32_t s = seed * 2654435761u + 1;
  for (auto& x : v) {
    s = s * 1664525u + 1013904223u;
    x = narrow<bf16_t>(float(int32_t(s >> 8) % 2001) / 1000.0f);
  }
  return v;
}

// C (+)= alpha op(A) op(B) in double, from the bf16 values.
std::vector<double> naive(const Case& c, const std::vector<bf16_t>& A, const std::vector<bf16_t>& B, float alpha) {
  std::vector<double> out(size_t(c.m * c.n), 0.0);
  for (int64_t i = 0; i < c.m; ++i)
    for (int64_t j = 0; j < c.n; ++j) {
      double s = 0;
      for (int64_t p = 0; p < c.k; ++p) {
        const double a = widen(c.trans_a ? A[size_t(p * c.m + i)] : A[size_t(i * c.k + p)]);
        const double b = widen(c.trans_b ? B[size_t(j * c.k + p)] : B[size_t(p * c.n + j)]);
        s += a * b;
      }
      out[size_t(i * c.n + j)] = double(alpha) * s;
    }
  return out;
}

// Runs the case through MatmulKernel and returns max |got - want| / max |want|.
double error_of(const Case& c, bool c_bf16, bool accumulate, float alpha) {
  const MatmulAttrs attrs{c.m, c.n, c.k, c.trans_a, c.trans_b, alpha};
  const MatmulTypes types{DType::bf16, DType::bf16, DType::f32, c_bf16 ? DType::bf16 : DType::f32};
  EXPECT_TRUE(runs_skinny_bf16(attrs, types.a, types.b, types.c, false));
  const std::vector<bf16_t> A = random_bf16(size_t(c.m * c.k), 1), B = random_bf16(size_t(c.k * c.n), 2);
  const std::vector<bf16_t> C0 = random_bf16(size_t(c.m * c.n), 3);
  std::vector<double> want = naive(c, A, B, alpha);
  if (accumulate)
    for (size_t i = 0; i < want.size(); ++i) want[i] += widen(C0[i]);
  const WriteVariants variants{!accumulate, accumulate};
  std::vector<std::byte> scratch(MatmulKernel::scratch_bytes(env(), attrs, false, variants, types) + 64);
  MatmulKernel kernel(env(), attrs, false, variants, types);
  std::vector<double> got(want.size());
  if (c_bf16) {
    std::vector<bf16_t> C = C0;
    kernel.bind(A.data(), B.data(), nullptr, C.data(), scratch.data());
    kernel.run(accumulate);
    for (size_t i = 0; i < got.size(); ++i) got[i] = widen(C[i]);
  } else {
    std::vector<float> C(C0.size());
    for (size_t i = 0; i < C.size(); ++i) C[i] = widen(C0[i]);
    kernel.bind(A.data(), B.data(), nullptr, C.data(), scratch.data());
    kernel.run(accumulate);
    got.assign(C.begin(), C.end());
  }
  double diff = 0, scale = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    diff = std::max(diff, std::fabs(got[i] - want[i]));
    scale = std::max(scale, std::fabs(want[i]));
  }
  return diff / scale;
}

// fp32 sums of K products, one lane's running sum each: rounding grows with K (2.8e-6 of the
// scale at K = 2048); a bf16 C adds its own rounding (2^-9 of an element, at most the scale).
// One product left out or counted twice is ~1e-3.
double f32_tolerance(int64_t k) { return 1e-6 + 4e-9 * double(k); }
constexpr double kBf16Tol = 4e-3;

class SkinnyBf16 : public ::testing::TestWithParam<Case> {};

TEST_P(SkinnyBf16, MatchesTheNaiveProduct) {
#if !defined(__AVX512BF16__)
  GTEST_SKIP() << "built without AVX512-BF16: these products run oneDNN";
#endif
  const Case c = GetParam();
  for (const bool c_bf16 : {false, true})
    for (const bool accumulate : {false, true}) {
      const double e = error_of(c, c_bf16, accumulate, accumulate ? 0.5f : 2.0f);
      EXPECT_LT(e, c_bf16 ? kBf16Tol : f32_tolerance(c.k)) << "m=" << c.m << " n=" << c.n << " k=" << c.k << " trans_a=" << c.trans_a
                                                << " trans_b=" << c.trans_b << " c_bf16=" << c_bf16
                                                << " accumulate=" << accumulate;
    }
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, SkinnyBf16,
    ::testing::Values(
        // LoRA's forward: x A^T (N narrow, B [N,K]) and s (x A) B^T (K narrow, B [N,K]).
        Case{256, 16, 2048, false, true}, Case{256, 2048, 16, false, true}, Case{37, 5, 94, false, true},
        Case{13, 70, 8, false, true}, Case{100, 64, 130, false, true}, Case{29, 33, 64, false, true},
        // Input gradients: dy B (N narrow, B [K,N]) and u A (K narrow, B [K,N]).
        Case{256, 16, 1000, false, false}, Case{77, 1030, 16, false, false}, Case{9, 3, 18, false, false}));

TEST(SkinnyBf16Routing, TakesOnlyNarrowEvenBf16ProductsWithoutBias) {
  const MatmulAttrs lora{1024, 16, 2048, false, true, 1.0f}, wide{1024, 2048, 2048, false, true, 1.0f},
      odd{1024, 16, 2047, false, true, 1.0f}, weight_grad{16, 2048, 1024, true, false, 1.0f};
#if defined(__AVX512BF16__)
  EXPECT_TRUE(runs_skinny_bf16(lora, DType::bf16, DType::bf16, DType::bf16, false));
#endif
  EXPECT_FALSE(runs_skinny_bf16(lora, DType::bf16, DType::bf16, DType::bf16, true));
  EXPECT_FALSE(runs_skinny_bf16(lora, DType::f32, DType::f32, DType::f32, false));
  EXPECT_FALSE(runs_skinny_bf16(wide, DType::bf16, DType::bf16, DType::bf16, false));
  EXPECT_FALSE(runs_skinny_bf16(odd, DType::bf16, DType::bf16, DType::bf16, false));
  EXPECT_FALSE(runs_skinny_bf16(weight_grad, DType::bf16, DType::bf16, DType::f32, false));  // stays on oneDNN
}

}  // namespace
}  // namespace memfit
