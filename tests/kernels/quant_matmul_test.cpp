// Dequantising products (kernels/quant/quant_matmul.hpp, cpu_quant_linear.hpp) against
//   - a naive oracle: the whole weight dequantised at once, then a triple loop in double;
//     the reference's forward equals it bit for bit (same dot products, one rounding), its
//     input gradient within one fp32 rounding per tile; the CPU version within the bounds of
//     fp32 accumulation (fp32 compute) or one bf16 rounding (bf16 compute);
//   - PyTorch (tests/fixtures/quant/bnb.safetensors: F.linear(x, dequant(W)) and dy @ dequant(W)
//     in bf16 on bitsandbytes' dequantised weights) within one bf16 rounding of either side;
// over tile heights that divide the rows, do not, are 1, and exceed the rows; plain and
// double-quantised nf4 / fp4 and int8; no allocation in either version; bad operands refused.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <type_traits>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "io/safetensors.hpp"
#include "kernels/quant/blockwise.hpp"
#include "kernels/quant/cpu_quant_linear.hpp"
#include "kernels/quant/quant_matmul.hpp"
#include "support/alloc_counter.hpp"
#include "support/paths.hpp"

namespace memfit {
namespace {

// A quantised weight with its storage.
struct OwnedWeight {
  std::vector<uint8_t> codes, absmax_codes;
  std::vector<float> absmax, absmax2;
  QuantizedWeight view;
};

template <class T>
OwnedWeight quantize_weight(const std::vector<T>& w, int64_t rows, int64_t cols, const QuantSpec& spec) {
  OwnedWeight o;
  const QuantStorage s = quant_storage(spec, rows * cols);
  o.codes.resize(s.codes);
  o.absmax.resize(size_t(quant_blocks(rows * cols, spec.block)));
  if (spec.kind == QuantKind::int8)
    quantize_int8<T>(w, spec, o.codes, o.absmax);
  else
    quantize_4bit<T>(w, spec, o.codes, o.absmax);
  o.view = QuantizedWeight{spec, rows, cols, o.codes, o.absmax, {}, {}, 0.0f};
  if (spec.double_quant) {
    o.absmax_codes.resize(o.absmax.size());
    o.absmax2.resize(s.absmax2 / 4);
    o.view.offset = double_quantize_absmax(o.absmax, o.absmax_codes, o.absmax2);
    o.view.absmax = {};
    o.view.absmax_codes = o.absmax_codes;
    o.view.absmax2 = o.absmax2;
  }
  return o;
}

template <class T>
T round_to_bf16_or_float(float v) {
  if constexpr (std::is_same_v<T, float>) {
    return v;
  } else {
    return round_to_bf16(v);
  }
}

template <class T>
std::vector<T> random_values(size_t n, uint32_t seed, float scale) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<T> v(n);
  for (auto& x : v) x = round_to_bf16_or_float<T>(dist(gen));
  return v;
}

// The oracle: y (unrounded, double) and sum |x||w| per element, with the whole weight expanded.
struct Oracle {
  std::vector<double> value, magnitude;
};

template <class T>
Oracle oracle_product(const std::vector<T>& in, int64_t m, const QuantizedWeight& w, bool input_grad) {
  std::vector<T> full(size_t(w.numel()));
  dequantize_range<T>(w, 0, w.numel(), full);
  const int64_t out_width = input_grad ? w.cols : w.rows, inner = input_grad ? w.rows : w.cols;
  Oracle o{std::vector<double>(size_t(m * out_width)), std::vector<double>(size_t(m * out_width))};
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < out_width; ++j) {
      double sum = 0.0, mag = 0.0;
      for (int64_t k = 0; k < inner; ++k) {
        const double a = widen(in[size_t(i * inner + k)]);
        const double b = input_grad ? widen(full[size_t(k * w.cols + j)]) : widen(full[size_t(j * w.cols + k)]);
        sum += a * b;
        mag += std::fabs(a * b);
      }
      o.value[size_t(i * out_width + j)] = sum;
      o.magnitude[size_t(i * out_width + j)] = mag;
    }
  return o;
}

// |got - oracle| <= relative * |oracle| + accumulation * magnitude, element by element.
template <class T>
void expect_near_oracle(const std::vector<T>& got, const Oracle& o, double relative, double accumulation,
                        const std::string& what) {
  ASSERT_EQ(got.size(), o.value.size()) << what;
  int64_t bad = 0;
  double worst = 0.0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double err = std::fabs(double(widen(got[i])) - o.value[i]);
    const double bound = relative * std::fabs(o.value[i]) + accumulation * o.magnitude[i] + 1e-30;
    worst = std::max(worst, err / bound);
    bad += err > bound;
  }
  EXPECT_EQ(bad, 0) << what << ": worst error " << worst << " of its bound";
}

constexpr double kFp32Eps = 0x1p-24;  // unit roundoff of fp32
constexpr double kBf16Eps = 0x1p-8;   // unit roundoff of bf16

const std::vector<QuantSpec> kSpecs = {{QuantKind::nf4, 64, false},
                                       {QuantKind::fp4, 64, true},
                                       {QuantKind::nf4, 32, true},  // blocks straddle rows of 48
                                       {QuantKind::int8, 128, false}};

std::string describe(const QuantSpec& spec, int64_t tile_rows) {
  return std::string(quant_kind_name(spec.kind)) + " block " + std::to_string(spec.block) +
         (spec.double_quant ? " dq" : "") + " tile " + std::to_string(tile_rows);
}

template <class T>
void check_reference(int64_t m, int64_t rows, int64_t cols) {
  const auto w = random_values<T>(size_t(rows * cols), 3, 0.05f);
  const auto x = random_values<T>(size_t(m * cols), 4, 1.0f);
  const auto dy = random_values<T>(size_t(m * rows), 5, 1.0f);
  for (const QuantSpec& spec : kSpecs) {
    const OwnedWeight q = quantize_weight(w, rows, cols, spec);
    const Oracle fwd = oracle_product(x, m, q.view, false), bwd = oracle_product(dy, m, q.view, true);
    for (int64_t tile_rows : {int64_t(1), int64_t(5), rows, rows + 13}) {
      const std::string what = describe(spec, tile_rows);
      std::vector<T> tile(size_t(quant_tile_elements(q.view, tile_rows))), y(size_t(m * rows));
      quant_linear_forward_reference<T>(x, m, q.view, tile_rows, tile, y);
      std::vector<T> expected(y.size());
      for (size_t i = 0; i < y.size(); ++i) expected[i] = round_to_bf16_or_float<T>(float(fwd.value[i]));
      EXPECT_EQ(std::memcmp(y.data(), expected.data(), y.size() * sizeof(T)), 0) << what << ": forward";
      std::vector<float> dx(size_t(m * cols));
      quant_linear_input_grad_reference<T>(dy, m, q.view, tile_rows, tile, dx);
      const double tiles = double((rows + tile_rows - 1) / tile_rows);
      expect_near_oracle(dx, bwd, 0.0, 2.0 * tiles * kFp32Eps, what + ": input grad");
    }
  }
}

TEST(QuantMatmul, ReferenceAgainstNaiveOracle) {
  check_reference<float>(5, 37, 48);
  check_reference<bf16_t>(5, 37, 48);
}

template <class T>
void check_cpu(int64_t m, int64_t rows, int64_t cols) {
  const DType compute = std::is_same_v<T, float> ? DType::f32 : DType::bf16;
  const DnnlEnv env = DnnlEnv::make_cpu();
  const auto w = random_values<T>(size_t(rows * cols), 6, 0.05f);
  const auto x = random_values<T>(size_t(m * cols), 7, 1.0f);
  const auto dy = random_values<T>(size_t(m * rows), 8, 1.0f);
  // fp32 accumulation inside oneDNN; bf16 outputs rounded once more.
  const double relative = compute == DType::bf16 ? kBf16Eps : 0.0;
  for (const QuantSpec& spec : kSpecs) {
    const OwnedWeight q = quantize_weight(w, rows, cols, spec);
    const Oracle fwd = oracle_product(x, m, q.view, false), bwd = oracle_product(dy, m, q.view, true);
    // The input gradient by tiles of columns (16 or 32 of them, or all of W; with tiles of one
    // row fewer than 16 fit and it takes rows) and by tiles of rows.
    for (int64_t tile_rows : {int64_t(1), int64_t(16), int64_t(24), rows + 13})
    for (GradTiles split : {GradTiles::automatic, GradTiles::columns, GradTiles::rows}) {
      const std::string what = describe(spec, tile_rows) + (compute == DType::bf16 ? " bf16" : " f32") +
                               (split == GradTiles::rows ? " grad by rows" : split == GradTiles::columns ? " grad by columns" : "");
      CpuQuantLinear product(env, QuantLinearShape{m, rows, cols, tile_rows, compute, split});
      std::vector<T> tile(size_t(product.tile_elements())), y(size_t(m * rows));
      std::vector<std::byte> scratch(product.scratch_bytes());
      std::vector<float> dx(size_t(m * cols), 1e30f);  // overwritten, not added to
      product.forward<T>(x, q.view, tile, scratch, y);
      product.input_grad<T>(dy, q.view, tile, scratch, dx);
      expect_near_oracle(y, fwd, relative, double(cols) * kFp32Eps, what + ": forward");
      expect_near_oracle(dx, bwd, 0.0, double(rows) * kFp32Eps, what + ": input grad");
    }
  }
}

TEST(QuantMatmul, CpuAgainstNaiveOracle) {
  check_cpu<float>(6, 64, 96);  // 64 rows: tiles of 16 divide them, 24 leave 16
  check_cpu<bf16_t>(6, 64, 96);
  check_cpu<bf16_t>(6, 96, 40);  // taller than wide
}

// The fixture's products: PyTorch's bf16 results on bitsandbytes' dequantised weight (the codec
// test shows memfit's dequantisation equals it bit for bit).
TEST(QuantMatmul, MatchesPyTorchOnBitsandbytesWeights) {
  const SafetensorsReader st(test::fixture_path("quant/bnb.safetensors"));
  auto load = [&](const std::string& name, Shape* shape) {
    const SafetensorsEntry* e = st.find(name);
    if (e == nullptr) throw Error("test", "fixture has no tensor " + name);
    std::vector<bf16_t> v(e->bytes() / 2);
    std::memcpy(v.data(), st.data(*e), e->bytes());
    if (shape) *shape = e->shape;
    return v;
  };
  const DnnlEnv env = DnnlEnv::make_cpu();
  struct Case {
    const char *name, *weight;
    QuantSpec spec;
  };
  for (const Case& c : {Case{"mm_awkward", "awkward", {QuantKind::nf4, 64, false}},
                        Case{"mm_random_nf4", "random", {QuantKind::nf4, 64, true}},
                        Case{"mm_random_fp4", "random", {QuantKind::fp4, 64, true}}}) {
    SCOPED_TRACE(c.name);
    Shape ws, xs;
    const auto w = load(std::string(c.weight) + ".w", &ws);
    const auto x = load(std::string(c.name) + ".x", &xs);
    const auto dy = load(std::string(c.name) + ".dy", nullptr);
    const int64_t m = xs[0], rows = ws[0], cols = ws[1];
    const OwnedWeight q = quantize_weight(w, rows, cols, c.spec);
    Oracle fwd = oracle_product(x, m, q.view, false), bwd = oracle_product(dy, m, q.view, true);
    const auto y_torch = load(std::string(c.name) + ".y", nullptr), dx_torch = load(std::string(c.name) + ".dx", nullptr);
    for (size_t i = 0; i < y_torch.size(); ++i) fwd.value[i] = widen(y_torch[i]);
    for (size_t i = 0; i < dx_torch.size(); ++i) bwd.value[i] = widen(dx_torch[i]);

    CpuQuantLinear product(env, QuantLinearShape{m, rows, cols, 8, DType::bf16});
    std::vector<bf16_t> tile(size_t(product.tile_elements())), y(size_t(m * rows));
    std::vector<std::byte> scratch(product.scratch_bytes());
    std::vector<float> dx(size_t(m * cols));
    product.forward<bf16_t>(x, q.view, tile, scratch, y);
    product.input_grad<bf16_t>(dy, q.view, tile, scratch, dx);
    // y: both sides round a sum to bf16, so they may be one bf16 ulp apart (2^-7 relative);
    // dx: only torch rounds to bf16 (half an ulp, 2^-8).
    expect_near_oracle(y, fwd, 2 * kBf16Eps, double(cols) * kFp32Eps, "cpu forward vs torch");
    expect_near_oracle(dx, bwd, kBf16Eps, double(rows) * kFp32Eps, "cpu input grad vs torch");

    quant_linear_forward_reference<bf16_t>(x, m, q.view, 5, tile, y);
    quant_linear_input_grad_reference<bf16_t>(dy, m, q.view, 5, tile, dx);
    expect_near_oracle(y, fwd, 2 * kBf16Eps, double(cols) * kFp32Eps, "reference forward vs torch");
    expect_near_oracle(dx, bwd, kBf16Eps, double(rows) * kFp32Eps, "reference input grad vs torch");
  }
}

TEST(QuantMatmul, ProductsAllocateNothing) {
  const int64_t m = 8, rows = 200, cols = 256;
  const auto w = random_values<bf16_t>(size_t(rows * cols), 9, 0.05f);
  const auto x = random_values<bf16_t>(size_t(m * cols), 10, 1.0f);
  const OwnedWeight q = quantize_weight(w, rows, cols, {QuantKind::nf4, 64, true});
  CpuQuantLinear product(DnnlEnv::make_cpu(), QuantLinearShape{m, rows, cols, 96, DType::bf16});
  std::vector<bf16_t> tile(size_t(product.tile_elements())), y(size_t(m * rows)), dy(size_t(m * rows));
  std::vector<std::byte> scratch(product.scratch_bytes());
  std::vector<float> dx(size_t(m * cols));
  product.forward<bf16_t>(x, q.view, tile, scratch, y);  // warm-up: OpenMP's thread team
  product.input_grad<bf16_t>(y, q.view, tile, scratch, dx);
  std::vector<bf16_t> small_tile(size_t(quant_tile_elements(q.view, 7)));
  quant_linear_forward_reference<bf16_t>(x, m, q.view, 7, small_tile, y);  // warm-up: static tables
  test::alloc_counter_start();
  product.forward<bf16_t>(x, q.view, tile, scratch, y);
  product.input_grad<bf16_t>(y, q.view, tile, scratch, dx);
  quant_linear_forward_reference<bf16_t>(x, m, q.view, 7, small_tile, y);
  quant_linear_input_grad_reference<bf16_t>(y, m, q.view, 7, small_tile, dx);
  const test::AllocCounts counts = test::alloc_counter_stop();
  EXPECT_EQ(counts.memfit_allocations, 0);
  EXPECT_EQ(counts.library_bytes_outstanding, 0);
}

template <class F>
void expect_kernels_error(F&& f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "no error; expected one mentioning '" << needle << "'";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_EQ(what.rfind("[kernels]", 0), 0u) << what;
    EXPECT_NE(what.find(needle), std::string::npos) << what;
  }
}

TEST(QuantMatmul, BadOperandsAreRefused) {
  const int64_t m = 3, rows = 20, cols = 64;
  const auto w = random_values<float>(size_t(rows * cols), 11, 0.05f);
  const OwnedWeight q = quantize_weight(w, rows, cols, {QuantKind::nf4, 64, false});
  std::vector<float> x(size_t(m * cols)), y(size_t(m * rows)), tile(size_t(8 * cols)), dx(size_t(m * cols));
  expect_kernels_error([&] { quant_linear_forward_reference<float>(x, m, q.view, 9, tile, y); },
                       "the tile has 512 elements, 9 rows of 64 need 576");
  expect_kernels_error([&] { quant_linear_forward_reference<float>(std::span(x).first(10), m, q.view, 8, tile, y); },
                       "x has 10 elements, not 3 x 64");
  expect_kernels_error([&] { quant_linear_input_grad_reference<float>(x, m, q.view, 8, tile, dx); },
                       "dy has 192 elements, not 3 x 20");
  expect_kernels_error([&] { quant_linear_forward_reference<float>(x, m, q.view, 0, tile, y); }, "tile of 0 rows");
  const DnnlEnv env = DnnlEnv::make_cpu();
  expect_kernels_error([&] { CpuQuantLinear(env, QuantLinearShape{m, rows, cols, 8, DType::f16}); },
                       "compute in f32 or bf16");
  CpuQuantLinear product(env, QuantLinearShape{m, rows, cols, 8, DType::f32});
  std::vector<std::byte> scratch(product.scratch_bytes());
  std::vector<bf16_t> x16(x.size()), y16(y.size()), tile16(tile.size());
  expect_kernels_error([&] { product.forward<bf16_t>(x16, q.view, tile16, scratch, y16); },
                       "prepared for fp32 called with bf16");
  QuantizedWeight other = q.view;
  other.rows = 10;
  other.codes = other.codes.first(320);
  other.absmax = other.absmax.first(10);
  expect_kernels_error([&] { product.forward<float>(x, other, tile, scratch, y); },
                       "prepared for a [20, 64] weight called with [10, 64]");
  product.forward<float>(x, q.view, tile, scratch, y);  // the right operands run
}

}  // namespace
}  // namespace memfit
