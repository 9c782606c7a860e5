// The LLaMA kernels (RMSNorm, SwiGLU, RoPE) against the naive references of
// reference_llama.hpp, in fp32 and in bf16/fp16 storage, in overwrite and accumulate modes and
// with the aliasing the contracts allow; the references themselves against central finite
// differences in double. Tolerances are normalised max errors (max|cpu - ref| / max|ref|),
// each derived where it is used. The subtle point is the oracle for 16-bit storage: inputs
// are rounded to the 16-bit type first and the reference runs on exactly those values, so
// what remains is the kernel's own roundings, each at most u = 2^-8 (bf16) or 2^-11 (fp16)
// of the element, hence of max|ref|; 1e-5 more covers the fp32 arithmetic.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <vector>

#include "core/half.hpp"
#include "kernel_test_util.hpp"
#include "kernels/cpu/rmsnorm.hpp"
#include "kernels/cpu/rope.hpp"
#include "kernels/cpu/swiglu.hpp"
#include "kernels/reference/reference_llama.hpp"

namespace memfit {
namespace {

using test::normalized_error;
using test::random_vector;
using Vec = std::vector<float>;
using DVec = std::vector<double>;

constexpr double kEps32 = 0x1p-24;  // fp32 unit roundoff
constexpr double kFp32Slack = 1e-5;

template <class T>
constexpr double unit_roundoff() {
  return std::is_same_v<T, bf16_t> ? 0x1p-8 : 0x1p-11;
}
template <class T>
const char* type_name() {
  return std::is_same_v<T, bf16_t> ? "bf16" : std::is_same_v<T, fp16_t> ? "fp16" : "fp32";
}

template <class T>
std::vector<T> narrowed(const Vec& v) {
  std::vector<T> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = narrow<T>(v[i]);
  return out;
}
template <class T>
Vec widened(const std::vector<T>& v) {
  Vec out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = widen(v[i]);
  return out;
}

using test::expect_thread_count_independent;

// ---------------------------------------------------------------------------------------
// RMSNorm

// The fp32 rstd sums C positive squares: relative error at most (C - 1) 2^-24, halved by the
// square root; y adds two roundings. For C <= 131 that is < 4.1e-6.
constexpr double kRmsForwardTol = 1e-5;

TEST(CpuRmsNorm, ForwardMatchesReference) {
  for (int64_t N : {1, 5, 33})
    for (int64_t C : {7, 64, 131}) {
      SCOPED_TRACE(testing::Message() << "N=" << N << " C=" << C);
      const Vec x = random_vector(N * C, 1, -2, 3), w = random_vector(C, 2);
      Vec y(N * C), rstd(N), ey(N * C), erstd(N);
      rmsnorm_forward(x.data(), w.data(), y.data(), rstd.data(), N, C, 1e-5f);
      ref::rmsnorm_forward(x.data(), w.data(), ey.data(), erstd.data(), N, C, 1e-5);
      EXPECT_LE(normalized_error(y, ey), kRmsForwardTol);
      EXPECT_LE(normalized_error(rstd, erstd), kRmsForwardTol);
      // In place, without rstd: the same bits as out of place.
      Vec inplace = x;
      rmsnorm_forward(inplace.data(), w.data(), inplace.data(), (float*)nullptr, N, C, 1e-5f);
      EXPECT_EQ(inplace, y);
    }
}

TEST(CpuRmsNorm, BackwardMatchesReferenceInEveryMode) {
  const int64_t N = 37, C = 131;
  const Vec x = random_vector(N * C, 3, -2, 3), w = random_vector(C, 4), dy = random_vector(N * C, 5);
  Vec y(N * C), rstd(N);
  rmsnorm_forward(x.data(), w.data(), y.data(), rstd.data(), N, C, 1e-5f);
  for (int mode = 0; mode < 4; ++mode) {
    const bool acc_dx = mode & 1, acc_dw = mode & 2;
    SCOPED_TRACE(testing::Message() << "acc dx/dw = " << acc_dx << acc_dw);
    const Vec dx0 = random_vector(N * C, 6), dw0 = random_vector(C, 7);
    Vec dx = dx0, dw = dw0, edx = dx0, edw = dw0;
    rmsnorm_backward(dy.data(), x.data(), w.data(), rstd.data(), dx.data(), dw.data(), N, C, acc_dx, acc_dw);
    ref::rmsnorm_backward(dy.data(), x.data(), w.data(), rstd.data(), edx.data(), edw.data(), N, C, acc_dx, acc_dw);
    // dx: a float sum over C terms of mixed signs (~C 2^-24 of the row's scale, < 1e-5).
    // dw: each term carries two float roundings (xhat, the product) and groups of kRowGroup
    // rows one per addition; with N = 37 rows of random signs the sum of |terms| is about
    // sqrt(N) = 6 times |dw|: ~20 * 2^-24 * 6 < 1e-5.
    EXPECT_LE(normalized_error(dx, edx), 1e-5);
    EXPECT_LE(normalized_error(dw, edw), 1e-5);
  }
  // In place: dx overwrites dy; dw absent.
  Vec inplace = dy, edx(N * C);
  rmsnorm_backward(inplace.data(), x.data(), w.data(), rstd.data(), inplace.data(), (float*)nullptr, N, C, false,
                   false);
  ref::rmsnorm_backward(dy.data(), x.data(), w.data(), rstd.data(), edx.data(), (float*)nullptr, N, C, false, false);
  EXPECT_LE(normalized_error(inplace, edx), 1e-5);
  // dx absent: dw alone, dy untouched.
  Vec dy_copy = dy, dw(C, 9.0f), edw(C);
  rmsnorm_backward(dy_copy.data(), x.data(), w.data(), rstd.data(), (float*)nullptr, dw.data(), N, C, false, false);
  ref::rmsnorm_backward(dy.data(), x.data(), w.data(), rstd.data(), (float*)nullptr, edw.data(), N, C, false, false);
  EXPECT_LE(normalized_error(dw, edw), 1e-5);
  EXPECT_EQ(dy_copy, dy);
}

TEST(CpuRmsNorm, BackwardGivesTheSameBitsOnAnyThreadCount) {
  // C = 200 is four column blocks (the last partial) and N = 301 rows is more than the row
  // pass's grain, so both passes split across threads.
  const int64_t N = 301, C = 200;
  const Vec x = random_vector(N * C, 8), w = random_vector(C, 9), dy = random_vector(N * C, 10);
  Vec y(N * C), rstd(N);
  rmsnorm_forward(x.data(), w.data(), y.data(), rstd.data(), N, C, 1e-6f);
  expect_thread_count_independent([&] {
    Vec dx(N * C), dw(C), acc = random_vector(C, 11);
    rmsnorm_backward(dy.data(), x.data(), w.data(), rstd.data(), dx.data(), dw.data(), N, C, false, false);
    rmsnorm_backward(dy.data(), x.data(), w.data(), rstd.data(), (float*)nullptr, acc.data(), N, C, false, true);
    return std::vector<Vec>{dx, dw, acc};
  });
  const auto xb = narrowed<bf16_t>(x), wb = narrowed<bf16_t>(w), dyb = narrowed<bf16_t>(dy);
  expect_thread_count_independent([&] {
    std::vector<bf16_t> yb(N * C);
    Vec rs(N), dw(C);
    rmsnorm_forward(xb.data(), wb.data(), yb.data(), rs.data(), N, C, 1e-6f);
    rmsnorm_backward(dyb.data(), xb.data(), wb.data(), rs.data(), (bf16_t*)nullptr, dw.data(), N, C, false, false);
    return std::vector<Vec>{widened(yb), rs, dw};
  });
}

// dx in 16-bit storage: long rows (C = 1000, 64 rows split across threads) so that a change of
// summation order in the row sums survives the rounding to 16 bits. GCC 12 once vectorised
// the row sum in the inline (one-thread) copy of the row loop only, so bf16 dx differed here.
template <class T>
void check_rmsnorm_lowp_dx_thread_count_independent() {
  SCOPED_TRACE(type_name<T>());
  const int64_t N = 64, C = 1000;
  const auto x = narrowed<T>(random_vector(N * C, 15)), w = narrowed<T>(random_vector(C, 16));
  const auto dy = narrowed<T>(random_vector(N * C, 17)), prior = narrowed<T>(random_vector(N * C, 18));
  Vec rstd(N);
  std::vector<T> y(N * C);
  rmsnorm_forward(x.data(), w.data(), y.data(), rstd.data(), N, C, 1e-6f);
  expect_thread_count_independent([&] {
    std::vector<T> dx(N * C), acc = prior;
    rmsnorm_backward(dy.data(), x.data(), w.data(), rstd.data(), dx.data(), (float*)nullptr, N, C, false, false);
    rmsnorm_backward(dy.data(), x.data(), w.data(), rstd.data(), acc.data(), (float*)nullptr, N, C, true, false);
    return std::vector<Vec>{widened(dx), widened(acc)};
  });
}

TEST(CpuRmsNorm, LowPrecisionDxGivesTheSameBitsOnAnyThreadCount) {
  check_rmsnorm_lowp_dx_thread_count_independent<bf16_t>();
  check_rmsnorm_lowp_dx_thread_count_independent<fp16_t>();
}

TEST(CpuRmsNorm, BackwardBitsDoNotDependOnAlignment) {
  // A vectorised reduction that peels iterations to align its loads would sum in an order set
  // by the buffers' addresses. Shift every operand by 1..15 floats (w by a different amount)
  // and compare with the unshifted run.
  const int64_t N = 33, C = 200, pad = 16;
  const Vec x = random_vector(N * C, 19), w = random_vector(C, 20), dy = random_vector(N * C, 21);
  auto run = [&](int64_t shift) {
    const int64_t ws = (shift * 7) % pad;
    Vec xs(N * C + pad), wsb(C + pad), dys(N * C + pad), rstd(N), dxs(N * C + pad), dw(C);
    std::copy(x.begin(), x.end(), xs.begin() + shift);
    std::copy(w.begin(), w.end(), wsb.begin() + ws);
    std::copy(dy.begin(), dy.end(), dys.begin() + shift);
    Vec y(N * C);
    rmsnorm_forward(xs.data() + shift, wsb.data() + ws, y.data(), rstd.data(), N, C, 1e-6f);
    rmsnorm_backward(dys.data() + shift, xs.data() + shift, wsb.data() + ws, rstd.data(), dxs.data() + shift,
                     dw.data(), N, C, false, false);
    return std::vector<Vec>{y, rstd, Vec(dxs.begin() + shift, dxs.begin() + shift + N * C), dw};
  };
  const auto base = run(0);
  for (int64_t shift = 1; shift < pad; ++shift) {
    const auto got = run(shift);
    for (size_t i = 0; i < base.size(); ++i)
      EXPECT_EQ(-1, test::first_bit_difference(base[i], got[i])) << "output " << i << ", shift " << shift;
  }
}

template <class T, class G>
void check_rmsnorm_lowp() {
  SCOPED_TRACE(testing::Message() << type_name<T>() << " gradients " << type_name<G>());
  const double u = unit_roundoff<T>();
  const int64_t N = 37, C = 130;
  const auto x = narrowed<T>(random_vector(N * C, 12, -3, 3)), w = narrowed<T>(random_vector(C, 13));
  const auto dy = narrowed<T>(random_vector(N * C, 14));
  const Vec xv = widened(x), wv = widened(w), dyv = widened(dy);
  std::vector<T> y(N * C);
  Vec rstd(N), ey(N * C), erstd(N);
  rmsnorm_forward(x.data(), w.data(), y.data(), rstd.data(), N, C, 1e-5f);
  ref::rmsnorm_forward(xv.data(), wv.data(), ey.data(), erstd.data(), N, C, 1e-5);
  // Two roundings to T (the normalised row, then its product with w), as HF does.
  EXPECT_LE(normalized_error(widened(y), ey), 2 * u + kFp32Slack);
  EXPECT_LE(normalized_error(rstd, erstd), kRmsForwardTol);  // statistics stay fp32
  // And bit for bit HF's order: (x * rstd) cast to T, then times w in T.
  for (int64_t n = 0; n < N; ++n)
    for (int64_t c = 0; c < C; ++c) {
      const T hf = narrow<T>(widen(narrow<T>(xv[n * C + c] * rstd[n])) * wv[c]);
      ASSERT_EQ(hf.bits, y[n * C + c].bits) << "n=" << n << " c=" << c;
    }

  // dw's terms use xhat rounded to T (the value the forward multiplied w by): each term is
  // off by at most u of itself, so dw by u * sum|terms|, which this bounds from the data.
  double sum_abs = 0;
  for (int64_t c = 0; c < C; ++c) {
    double s = 0;
    for (int64_t n = 0; n < N; ++n) s += std::fabs(double(dyv[n * C + c]) * xv[n * C + c] * rstd[n]);
    sum_abs = std::max(sum_abs, s);
  }
  const bool g16 = !std::is_same_v<G, float>;
  for (bool acc : {false, true}) {
    SCOPED_TRACE(testing::Message() << "acc=" << acc);
    const auto dx0 = narrowed<T>(random_vector(N * C, 15));
    std::vector<G> dw0(C);
    for (int64_t c = 0; c < C; ++c) dw0[c] = narrow<G>(float(c % 7) - 3.0f);
    std::vector<T> dx = dx0;
    std::vector<G> dw = dw0;
    Vec edx = widened(dx0), edw = widened(dw0);
    rmsnorm_backward(dy.data(), x.data(), w.data(), rstd.data(), dx.data(), dw.data(), N, C, acc, acc);
    ref::rmsnorm_backward(dyv.data(), xv.data(), wv.data(), rstd.data(), edx.data(), edw.data(), N, C, acc, acc);
    EXPECT_LE(normalized_error(widened(dx), edx), u + kFp32Slack);  // one rounding
    double scale = 0;
    for (float v : edw) scale = std::max(scale, double(std::fabs(v)));
    EXPECT_LE(normalized_error(widened(dw), edw), u * sum_abs / scale + (g16 ? u : 0.0) + kFp32Slack);
  }
  // In place: dx over dy, out of place as the oracle (same arithmetic, same bits).
  std::vector<T> inplace = dy, dx(N * C);
  rmsnorm_backward(inplace.data(), x.data(), w.data(), rstd.data(), inplace.data(), (G*)nullptr, N, C, false, false);
  rmsnorm_backward(dy.data(), x.data(), w.data(), rstd.data(), dx.data(), (G*)nullptr, N, C, false, false);
  EXPECT_EQ(0, std::memcmp(inplace.data(), dx.data(), dx.size() * sizeof(T)));
}

TEST(CpuRmsNorm, Bf16AndFp16MatchReference) {
  check_rmsnorm_lowp<bf16_t, float>();
  check_rmsnorm_lowp<bf16_t, bf16_t>();
  check_rmsnorm_lowp<fp16_t, float>();
  check_rmsnorm_lowp<fp16_t, fp16_t>();
}

// ---------------------------------------------------------------------------------------
// SwiGLU

// exp_approx is within ~2 ulp and the sigmoid, its complement e * s and the products add a
// few float roundings each: under 10 * 2^-24 of the element. The one cancellation,
// 1 + g (1 - s) near g = -1.28, is absolute: at most a few ulp of |g (1 - s)| <= 0.28 times
// |dy up|, which max|ref| is of the order of.
constexpr double kSwigluTol = 1e-6;

TEST(CpuSwiGlu, ForwardAndBackwardMatchReference) {
  const int64_t n = 10007;  // not a multiple of the vector width or the tile
  const Vec gate = random_vector(n, 20, -12, 12), up = random_vector(n, 21, -2, 2), dy = random_vector(n, 22);
  Vec y(n), ey(n);
  swiglu_forward(gate.data(), up.data(), y.data(), n);
  ref::swiglu_forward(gate.data(), up.data(), ey.data(), n);
  EXPECT_LE(normalized_error(y, ey), kSwigluTol);
  // y over gate, y over up: the same bits as out of place.
  Vec over_gate = gate, over_up = up;
  swiglu_forward(over_gate.data(), up.data(), over_gate.data(), n);
  swiglu_forward(gate.data(), over_up.data(), over_up.data(), n);
  EXPECT_EQ(over_gate, y);
  EXPECT_EQ(over_up, y);
  for (int mode = 0; mode < 4; ++mode) {
    const bool acc_g = mode & 1, acc_u = mode & 2;
    SCOPED_TRACE(testing::Message() << "acc dgate/dup = " << acc_g << acc_u);
    const Vec g0 = random_vector(n, 23), u0 = random_vector(n, 24);
    Vec dg = g0, du = u0, edg = g0, edu = u0;
    swiglu_backward(dy.data(), gate.data(), up.data(), dg.data(), du.data(), n, acc_g, acc_u);
    ref::swiglu_backward(dy.data(), gate.data(), up.data(), edg.data(), edu.data(), n, acc_g, acc_u);
    EXPECT_LE(normalized_error(dg, edg), kSwigluTol);
    EXPECT_LE(normalized_error(du, edu), kSwigluTol);
  }
  // dgate in place of dy, with dup written too (it must still see the original dy).
  Vec inplace = dy, du(n), edg(n), edu(n);
  swiglu_backward(inplace.data(), gate.data(), up.data(), inplace.data(), du.data(), n, false, false);
  ref::swiglu_backward(dy.data(), gate.data(), up.data(), edg.data(), edu.data(), n, false, false);
  EXPECT_LE(normalized_error(inplace, edg), kSwigluTol);
  EXPECT_LE(normalized_error(du, edu), kSwigluTol);
  // One output absent.
  Vec only_up(n);
  swiglu_backward(dy.data(), gate.data(), up.data(), (float*)nullptr, only_up.data(), n, false, false);
  EXPECT_EQ(only_up, du);
}

TEST(CpuSwiGlu, SaturatesWithoutNaNs) {
  const Vec gate = {-1000.0f, -100.0f, -88.0f, 0.0f, 88.0f, 100.0f, 1000.0f}, up(7, 1.0f), dy(7, 1.0f);
  const int64_t n = int64_t(gate.size());
  Vec y(n), dg(n), du(n), ey(n), edg(n), edu(n);
  swiglu_forward(gate.data(), up.data(), y.data(), n);
  swiglu_backward(dy.data(), gate.data(), up.data(), dg.data(), du.data(), n, false, false);
  ref::swiglu_forward(gate.data(), up.data(), ey.data(), n);
  ref::swiglu_backward(dy.data(), gate.data(), up.data(), edg.data(), edu.data(), n, false, false);
  for (int64_t i = 0; i < n; ++i) {
    SCOPED_TRACE(testing::Message() << "gate=" << gate[i]);
    // silu is g or ~0 here, silu' 1 or ~0: compared absolutely (the exact tails are far
    // below any float the kernel needs to resolve).
    EXPECT_NEAR(y[i], ey[i], 1e-6 * std::fabs(gate[i]) + 1e-30);
    EXPECT_NEAR(dg[i], edg[i], 1e-6);
    EXPECT_NEAR(du[i], edu[i], 1e-6 * std::fabs(gate[i]) + 1e-30);
  }
}

template <class T>
void check_swiglu_lowp() {
  SCOPED_TRACE(type_name<T>());
  const double tol = unit_roundoff<T>() + kFp32Slack;  // one rounding of each output
  const int64_t n = 4099;
  const auto gate = narrowed<T>(random_vector(n, 25, -8, 8)), up = narrowed<T>(random_vector(n, 26, -2, 2));
  const auto dy = narrowed<T>(random_vector(n, 27));
  const Vec gv = widened(gate), uv = widened(up), dyv = widened(dy);
  std::vector<T> y(n);
  Vec ey(n);
  swiglu_forward(gate.data(), up.data(), y.data(), n);
  ref::swiglu_forward(gv.data(), uv.data(), ey.data(), n);
  EXPECT_LE(normalized_error(widened(y), ey), tol);
  for (bool acc : {false, true}) {
    SCOPED_TRACE(testing::Message() << "acc=" << acc);
    const auto g0 = narrowed<T>(random_vector(n, 28)), u0 = narrowed<T>(random_vector(n, 29));
    std::vector<T> dg = g0, du = u0;
    Vec edg = widened(g0), edu = widened(u0);
    swiglu_backward(dy.data(), gate.data(), up.data(), dg.data(), du.data(), n, acc, acc);
    ref::swiglu_backward(dyv.data(), gv.data(), uv.data(), edg.data(), edu.data(), n, acc, acc);
    EXPECT_LE(normalized_error(widened(dg), edg), tol);
    EXPECT_LE(normalized_error(widened(du), edu), tol);
  }
  std::vector<T> inplace = dy, dg(n), du(n), du2(n);
  swiglu_backward(dy.data(), gate.data(), up.data(), dg.data(), du.data(), n, false, false);
  swiglu_backward(inplace.data(), gate.data(), up.data(), inplace.data(), du2.data(), n, false, false);
  EXPECT_EQ(0, std::memcmp(inplace.data(), dg.data(), n * sizeof(T)));
  EXPECT_EQ(0, std::memcmp(du2.data(), du.data(), n * sizeof(T)));
}

TEST(CpuSwiGlu, Bf16AndFp16MatchReference) {
  check_swiglu_lowp<bf16_t>();
  check_swiglu_lowp<fp16_t>();
}

// ---------------------------------------------------------------------------------------
// RoPE

// The kernel's angles are HF's float32 ones, the reference's exact. inv_freq = 1 / theta^e
// with e = 2i/HS rounded (relative 2^-24, which theta^e turns into e ln(theta) 2^-24), powf
// within 1 ulp (2 * 2^-24) and the division (2^-24); the product t * inv_freq one more
// rounding. inv_freq <= 1, so |angle error| <= (T - 1)(ln theta + 4) 2^-24. A pair's error is
// its norm times that plus a few roundings from cosf, sinf and the products; a pair's norm is
// at most sqrt(2) max|x| <= 2 max|y|.
double rope_tol(int64_t T, double theta) {
  return 2 * (double(T - 1) * (std::log(theta) + 4) * kEps32 + 8 * kEps32);
}

struct RopeShape {
  int64_t B, T, H, KV, HS;
  int64_t row() const { return (H + 2 * KV) * HS; }
  int64_t numel() const { return B * T * row(); }
};

// Value heads of every row and every element of position-0 rows are bit for bit the input.
template <class T>
void expect_unrotated_parts_unchanged(const std::vector<T>& in, const std::vector<T>& out, const RopeShape& s) {
  for (int64_t b = 0; b < s.B; ++b)
    for (int64_t t = 0; t < s.T; ++t) {
      const int64_t r = (b * s.T + t) * s.row();
      const int64_t from = t == 0 ? 0 : (s.H + s.KV) * s.HS;
      EXPECT_EQ(0, std::memcmp(&in[r + from], &out[r + from], (s.row() - from) * sizeof(T)))
          << "b=" << b << " t=" << t;
    }
}

TEST(CpuRope, ForwardAndBackwardMatchReference) {
  const float theta = 10000.0f;
  for (const RopeShape s : {RopeShape{2, 13, 4, 2, 8}, RopeShape{3, 7, 3, 3, 6}, RopeShape{1, 5, 2, 1, 2},
                            RopeShape{2, 9, 4, 2, 128}, RopeShape{1, 3, 2, 1, 512}}) {
    SCOPED_TRACE(testing::Message() << "B=" << s.B << " T=" << s.T << " H=" << s.H << " KV=" << s.KV
                                    << " HS=" << s.HS);
    const Vec x = random_vector(s.numel(), 30);
    Vec y(x.size()), ey(x.size());
    rope_forward(x.data(), y.data(), s.B, s.T, s.H, s.KV, s.HS, theta);
    ref::rope_forward(x.data(), ey.data(), s.B, s.T, s.H, s.KV, s.HS, double(theta));
    EXPECT_LE(normalized_error(y, ey), rope_tol(s.T, theta));
    expect_unrotated_parts_unchanged(x, y, s);
    Vec dx(x.size()), edx(x.size());
    rope_backward(x.data(), dx.data(), s.B, s.T, s.H, s.KV, s.HS, theta);
    ref::rope_backward(x.data(), edx.data(), s.B, s.T, s.H, s.KV, s.HS, double(theta));
    EXPECT_LE(normalized_error(dx, edx), rope_tol(s.T, theta));
    expect_unrotated_parts_unchanged(x, dx, s);
    // In place: the same bits as out of place.
    Vec inplace = x;
    rope_forward(inplace.data(), inplace.data(), s.B, s.T, s.H, s.KV, s.HS, theta);
    EXPECT_EQ(inplace, y);
    inplace = x;
    rope_backward(inplace.data(), inplace.data(), s.B, s.T, s.H, s.KV, s.HS, theta);
    EXPECT_EQ(inplace, dx);
  }
}

TEST(CpuRope, ForwardThenBackwardRestoresTheInput) {
  // GQA: 4 query heads, 2 key and 2 value heads; Llama's theta; in place both ways.
  const RopeShape s{2, 64, 4, 2, 64};
  const float theta = 500000.0f;
  const Vec x = random_vector(s.numel(), 31);
  Vec v = x;
  rope_forward(v.data(), v.data(), s.B, s.T, s.H, s.KV, s.HS, theta);
  EXPECT_GT(normalized_error(v, x), 0.1);  // it did rotate
  rope_backward(v.data(), v.data(), s.B, s.T, s.H, s.KV, s.HS, theta);
  // The same float cos and sin both ways, so the result is the pair times cos^2 + sin^2
  // (within 3 ulp of 1) plus two roundings per product and sum in each direction: < 12 ulp.
  EXPECT_LE(normalized_error(v, x), 12 * kEps32 * 2);
  expect_unrotated_parts_unchanged(x, v, s);
}

TEST(CpuRope, AnglesAreHfFloat32Angles) {
  // Long positions, where HF's float32 angles and the exact ones part by up to half an ulp
  // of the angle: the kernel must follow HF's. The expectation rotates by HF's angle
  // (transcribed from LlamaRotaryEmbedding) in double, so only cosf/sinf (1 ulp each) and the
  // kernel's products and sum remain: a few 2^-24 of the pair's norm (<= 2 max|y|).
  const RopeShape s{1, 4096, 1, 1, 8};
  const float theta = 10000.0f;
  const Vec x = random_vector(s.numel(), 32);
  Vec y(x.size()), exact(x.size());
  rope_forward(x.data(), y.data(), s.B, s.T, s.H, s.KV, s.HS, theta);
  ref::rope_forward(x.data(), exact.data(), s.B, s.T, s.H, s.KV, s.HS, double(theta));
  Vec hf = x;
  const int64_t half = s.HS / 2;
  for (int64_t t = 0; t < s.T; ++t)
    for (int64_t h = 0; h < s.H + s.KV; ++h)
      for (int64_t i = 0; i < half; ++i) {
        const float inv_freq = 1.0f / std::pow(theta, float(2 * i) / float(s.HS));
        const double a = double(float(t) * inv_freq);
        const int64_t k = t * s.row() + h * s.HS + i;
        hf[k] = float(double(x[k]) * std::cos(a) - double(x[k + half]) * std::sin(a));
        hf[k + half] = float(double(x[k + half]) * std::cos(a) + double(x[k]) * std::sin(a));
      }
  const double tol = 2 * 6 * kEps32;
  EXPECT_LE(normalized_error(y, hf), tol);
  // The exact angles are far enough from HF's here that the check above discriminates.
  EXPECT_GT(normalized_error(hf, exact), 10 * tol);
}

template <class T>
void check_rope_lowp() {
  SCOPED_TRACE(type_name<T>());
  const RopeShape s{2, 11, 4, 2, 34};
  const float theta = 10000.0f;
  const double tol = unit_roundoff<T>() + rope_tol(s.T, theta);  // one rounding to T
  const auto x = narrowed<T>(random_vector(s.numel(), 33));
  const Vec xv = widened(x);
  std::vector<T> y(x.size()), dx(x.size());
  Vec ey(x.size()), edx(x.size());
  rope_forward(x.data(), y.data(), s.B, s.T, s.H, s.KV, s.HS, theta);
  rope_backward(x.data(), dx.data(), s.B, s.T, s.H, s.KV, s.HS, theta);
  ref::rope_forward(xv.data(), ey.data(), s.B, s.T, s.H, s.KV, s.HS, double(theta));
  ref::rope_backward(xv.data(), edx.data(), s.B, s.T, s.H, s.KV, s.HS, double(theta));
  EXPECT_LE(normalized_error(widened(y), ey), tol);
  EXPECT_LE(normalized_error(widened(dx), edx), tol);
  expect_unrotated_parts_unchanged(x, y, s);
  expect_unrotated_parts_unchanged(x, dx, s);
  std::vector<T> inplace = x;
  rope_forward(inplace.data(), inplace.data(), s.B, s.T, s.H, s.KV, s.HS, theta);
  EXPECT_EQ(0, std::memcmp(inplace.data(), y.data(), y.size() * sizeof(T)));
}

TEST(CpuRope, Bf16AndFp16MatchReference) {
  check_rope_lowp<bf16_t>();
  check_rope_lowp<fp16_t>();
}

// ---------------------------------------------------------------------------------------
// The references themselves: backward against central finite differences of the forward in
// double, for L = sum(G * forward(...)) with a random G (h = 1e-5: truncation ~1e-10,
// rounding ~1e-11, so 1e-7 is a wide margin while a wrong term shows up at order 1), and
// closed forms for the forwards, which finite differences only check for consistency.

using test::dot;
using test::kGradTol;
using test::numeric_grad;

TEST(LlamaReferenceGradcheck, RmsNorm) {
  const int64_t N = 3, C = 7;
  DVec x = random_vector<double>(N * C, 40, -2, 2), w = random_vector<double>(C, 41);
  const DVec G = random_vector<double>(N * C, 42);
  auto objective = [&] {
    DVec y(N * C);
    ref::rmsnorm_forward(x.data(), w.data(), y.data(), (double*)nullptr, N, C, 1e-5);
    return dot(G, y);
  };
  DVec y(N * C), rstd(N), dx(N * C), dw(C);
  ref::rmsnorm_forward(x.data(), w.data(), y.data(), rstd.data(), N, C, 1e-5);
  ref::rmsnorm_backward(G.data(), x.data(), w.data(), rstd.data(), dx.data(), dw.data(), N, C, false, false);
  EXPECT_LE(normalized_error(dx, numeric_grad(x, objective)), kGradTol);
  EXPECT_LE(normalized_error(dw, numeric_grad(w, objective)), kGradTol);
}

TEST(LlamaReferenceGradcheck, SwiGlu) {
  const int64_t n = 23;
  DVec gate = random_vector<double>(n, 43, -6, 6), up = random_vector<double>(n, 44, -2, 2);
  const DVec G = random_vector<double>(n, 45);
  auto objective = [&] {
    DVec y(n);
    ref::swiglu_forward(gate.data(), up.data(), y.data(), n);
    return dot(G, y);
  };
  DVec dgate(n), dup(n);
  ref::swiglu_backward(G.data(), gate.data(), up.data(), dgate.data(), dup.data(), n, false, false);
  EXPECT_LE(normalized_error(dgate, numeric_grad(gate, objective)), kGradTol);
  EXPECT_LE(normalized_error(dup, numeric_grad(up, objective)), kGradTol);
}

TEST(LlamaReferenceGradcheck, Rope) {
  const RopeShape s{2, 5, 2, 1, 6};
  DVec x = random_vector<double>(s.numel(), 46);
  const DVec G = random_vector<double>(s.numel(), 47);
  auto objective = [&] {
    DVec y(x.size());
    ref::rope_forward(x.data(), y.data(), s.B, s.T, s.H, s.KV, s.HS, 10000.0);
    return dot(G, y);
  };
  DVec dx(x.size());
  ref::rope_backward(G.data(), dx.data(), s.B, s.T, s.H, s.KV, s.HS, 10000.0);
  EXPECT_LE(normalized_error(dx, numeric_grad(x, objective)), kGradTol);
}

TEST(LlamaReference, ForwardClosedForms) {
  // RMSNorm with w = 1 and eps = 0: every row has root mean square 1 and keeps its direction.
  const int64_t N = 4, C = 9;
  const DVec x = random_vector<double>(N * C, 48, -3, 3), ones(C, 1.0);
  DVec y(N * C), rstd(N);
  ref::rmsnorm_forward(x.data(), ones.data(), y.data(), rstd.data(), N, C, 0.0);
  for (int64_t n = 0; n < N; ++n) {
    double ms = 0;
    for (int64_t c = 0; c < C; ++c) ms += y[n * C + c] * y[n * C + c] / double(C);
    EXPECT_NEAR(ms, 1.0, 1e-12);
    for (int64_t c = 0; c < C; ++c) EXPECT_NEAR(y[n * C + c], x[n * C + c] * rstd[n], 1e-12);
  }
  // SwiGLU at known points: silu(0) = 0, silu(1) = 1 / (1 + 1/e), silu'(0) = 1/2.
  const DVec g = {0.0, 1.0}, u = {3.0, 2.0}, d = {1.0, 1.0};
  DVec sy(2), sdg(2), sdu(2);
  ref::swiglu_forward(g.data(), u.data(), sy.data(), 2);
  ref::swiglu_backward(d.data(), g.data(), u.data(), sdg.data(), sdu.data(), 2, false, false);
  EXPECT_DOUBLE_EQ(sy[0], 0.0);
  EXPECT_NEAR(sy[1], 2.0 / (1.0 + std::exp(-1.0)), 1e-15);
  EXPECT_NEAR(sdg[0], 3.0 * 0.5, 1e-15);
  EXPECT_NEAR(sdu[1], 1.0 / (1.0 + std::exp(-1.0)), 1e-15);
  // RoPE with HS = 2: the one pair of a head rotates by exactly t radians (inv_freq = 1);
  // H = 1, KV = 1: the key head rotates too, the value head is copied.
  const int64_t T = 4;
  DVec r(T * 6);
  for (int64_t i = 0; i < T * 6; ++i) r[i] = double(i % 6) + 1.0;
  DVec ry(r.size());
  ref::rope_forward(r.data(), ry.data(), 1, T, 1, 1, 2, 10000.0);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < 2; ++h) {
      const double x0 = r[t * 6 + 2 * h], x1 = r[t * 6 + 2 * h + 1], a = double(t);
      EXPECT_NEAR(ry[t * 6 + 2 * h], x0 * std::cos(a) - x1 * std::sin(a), 1e-14);
      EXPECT_NEAR(ry[t * 6 + 2 * h + 1], x1 * std::cos(a) + x0 * std::sin(a), 1e-14);
    }
  for (int64_t t = 0; t < T; ++t) {
    EXPECT_EQ(ry[t * 6 + 4], r[t * 6 + 4]);
    EXPECT_EQ(ry[t * 6 + 5], r[t * 6 + 5]);
  }
}

}  // namespace
}  // namespace memfit
