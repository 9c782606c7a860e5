// Optimizer-section kernels against closed forms and the naive references
// (kernels/reference/reference_optimizer.hpp):
//   - the dynamic quantization maps entry by entry;
//   - the bucketed encoder against an exhaustive nearest-entry search, and its AVX-512 form
//     against its scalar form;
//   - blockwise round trips within the error bound the map implies (half the gap between
//     the two entries around the value, times the block's absmax);
//   - one 8-bit AdamW step (and three, each from the kernel's own state) against the
//     reference in double; independence of the thread count;
//   - the global gradient norm, the clipping coefficient, and AdamW with clipping and loss
//     scaling through the backend's ops.
// (GCC 12's AVX-512 headers trip its own -Wuninitialized when inlined; see adamw8bit.cpp.)
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "kernel_test_util.hpp"
#include "kernels/backend.hpp"
#include "kernels/cpu/adamw.hpp"
#include "kernels/cpu/adamw8bit.hpp"
#include "kernels/cpu/grad_norm.hpp"
#include "kernels/cpu/quant_codec.hpp"
#include "kernels/quant_map.hpp"
#include "kernels/reference/reference.hpp"
#include "kernels/reference/reference_optimizer.hpp"
#include "program_fixture.hpp"

namespace memfit {
namespace {

using test::normalized_error;
using test::random_vector;
using Vec = std::vector<float>;

// Magnitudes spread over ten decades with both signs, as Adam's moments are.
Vec log_uniform(size_t n, uint32_t seed, double lo_exp, double hi_exp, bool with_sign) {
  const Vec e = random_vector(n, seed, lo_exp, hi_exp), s = random_vector(n, seed + 1);
  Vec x(n);
  for (size_t i = 0; i < n; ++i) x[i] = float(std::pow(10.0, double(e[i]))) * (with_sign && s[i] < 0 ? -1.0f : 1.0f);
  return x;
}

// Half the gap between the map entries around y (y inside [map[0], map[255]]).
double half_gap(const QuantMap& map, double y) {
  for (int c = 0; c + 1 < kQuantMapSize; ++c)
    if (y <= double(map[size_t(c + 1)])) return (double(map[size_t(c + 1)]) - double(map[size_t(c)])) / 2;
  return 0;
}

TEST(QuantMap, EntriesFollowTheDynamicExponentAndLinearFraction) {
  for (bool is_signed : {true, false}) {
    const QuantMap& map = is_signed ? dynamic_map_signed() : dynamic_map_unsigned();
    for (int c = 0; c + 1 < kQuantMapSize; ++c) ASSERT_LT(map[size_t(c)], map[size_t(c + 1)]) << c;
    EXPECT_EQ(map.back(), 1.0f);
    EXPECT_EQ(map[size_t(zero_code(map))], 0.0f);
    // Decade e (magnitudes in [0.1, 1) x 10^(e-6)) holds 2^e positive entries (signed) or
    // 2^(e+1) (unsigned): the midpoints of that many equal steps of [0.1, 1].
    for (int e = 0; e < 7; ++e) {
      const double lo = 0.1 * std::pow(10.0, e - 6), hi = std::pow(10.0, e - 6);
      const int n = is_signed ? 1 << e : 1 << (e + 1);
      int count = 0, negatives = 0;
      for (float v : map) {
        count += double(v) >= lo && double(v) < hi;
        negatives += -double(v) >= lo && -double(v) < hi;
      }
      EXPECT_EQ(count, n) << "decade " << e;
      EXPECT_EQ(negatives, is_signed ? n : 0) << "decade " << e;
      for (int j = 0; j < n; ++j) {
        const double want = hi * (0.1 + 0.9 * (j + 0.5) / n);
        EXPECT_NE(std::find(map.begin(), map.end(), float(want)), map.end()) << "decade " << e << " step " << j;
      }
    }
  }
  EXPECT_EQ(zero_code(dynamic_map_signed()), 127);
  EXPECT_EQ(zero_code(dynamic_map_unsigned()), 0);
  EXPECT_FLOAT_EQ(dynamic_map_signed().front(), -(0.1f + 0.9f * 63.5f / 64.0f));
}

TEST(QuantCodec, EncoderMatchesExhaustiveNearestSearch) {
  for (bool is_signed : {true, false}) {
    const QuantMap& map = is_signed ? dynamic_map_signed() : dynamic_map_unsigned();
    const QuantCodec& codec = is_signed ? signed_codec() : unsigned_codec();
    std::printf("%s map: buckets of %d mantissa bits, %d buckets\n", is_signed ? "signed" : "unsigned",
                codec.bucket_bits(), codec.buckets());
    Vec ys = log_uniform(200000, 11, -9, 0.1, is_signed);
    // Every entry, every midpoint and their float neighbours, zeros, the ends and beyond.
    for (int c = 0; c < kQuantMapSize; ++c) {
      const float v = map[size_t(c)];
      ys.insert(ys.end(), {v, std::nextafter(v, -2.0f), std::nextafter(v, 2.0f)});
      if (c + 1 < kQuantMapSize) {
        const float mid = float((double(v) + double(map[size_t(c + 1)])) / 2);
        ys.insert(ys.end(), {mid, std::nextafter(mid, -2.0f), std::nextafter(mid, 2.0f)});
      }
    }
    ys.insert(ys.end(), {0.0f, -0.0f, 1.0f, -1.0f, 1.5f, -1.5f, 1e-30f, -1e-30f});
    int64_t near_ties = 0;
    for (float y : ys) {
      const int got = codec.encode(y), want = ref::quantize_nearest(map, double(y));
      if (got == want) continue;
      // Only a value within float rounding of a midpoint may go either way: the midpoints are
      // rounded to float (half an ulp), so the two distances differ by at most about an ulp.
      const double d_got = std::fabs(double(y) - double(map[size_t(got)]));
      const double d_want = std::fabs(double(y) - double(map[size_t(want)]));
      ASSERT_LE(d_got - d_want, 2.5e-7 * std::fabs(double(y))) << "y = " << y << ": code " << got << ", nearest " << want;
      ++near_ties;
    }
    EXPECT_LE(near_ties, 2 * kQuantMapSize) << "disagreements away from the midpoints";
    for (int c = 0; c < kQuantMapSize; ++c) EXPECT_EQ(codec.encode(map[size_t(c)]), c) << "entry " << c;
  }
}

#if defined(__AVX512F__)
TEST(QuantCodec, VectorFormGivesTheScalarCodes) {
  for (bool is_signed : {true, false}) {
    const QuantCodec& codec = is_signed ? signed_codec() : unsigned_codec();
    Vec ys = log_uniform(4096, 21, -10, 0.2, true);
    ys.insert(ys.end(), {0.0f, -0.0f, 1.0f, -1.0f, std::numeric_limits<float>::infinity(), 3e-39f, -3e-39f, 2.0f});
    ys.resize((ys.size() + 15) / 16 * 16, 0.5f);
    std::vector<uint8_t> codes(ys.size());
    for (size_t i = 0; i < ys.size(); i += 16)
      _mm_storeu_si128(reinterpret_cast<__m128i*>(codes.data() + i), codec.encode16(_mm512_loadu_ps(ys.data() + i)));
    for (size_t i = 0; i < ys.size(); ++i) ASSERT_EQ(codes[i], codec.encode(ys[i])) << "y = " << ys[i];
    std::vector<uint8_t> all(256);
    for (int c = 0; c < 256; ++c) all[size_t(c)] = uint8_t(c);
    for (int c = 0; c < 256; c += 16) {
      alignas(64) float got[16];
      _mm512_store_ps(got, codec.decode16(all.data() + c));
      for (int k = 0; k < 16; ++k) ASSERT_EQ(got[k], codec.decode(uint8_t(c + k)));
    }
  }
}
#endif

TEST(QuantCodec, BlockwiseRoundTripStaysWithinTheMapsBound) {
  const int64_t n = 256 * 37 + 100, block = 256;
  for (bool is_signed : {true, false}) {
    const QuantMap& map = is_signed ? dynamic_map_signed() : dynamic_map_unsigned();
    const QuantCodec& codec = is_signed ? signed_codec() : unsigned_codec();
    Vec x = log_uniform(size_t(n), 31, -8, 0, is_signed);
    // Blocks of very different scales, and one all-zero block.
    for (int64_t i = 0; i < n; ++i) x[size_t(i)] *= float(std::pow(10.0, double((i / block) % 5) - 2));
    std::fill(x.begin() + 3 * block, x.begin() + 4 * block, 0.0f);
    std::vector<uint8_t> codes(static_cast<size_t>(n)), ref_codes(static_cast<size_t>(n));
    Vec absmax(static_cast<size_t>((n + block - 1) / block)), ref_absmax(absmax.size()), back(static_cast<size_t>(n));
    quantize_blockwise(codec, x.data(), codes.data(), absmax.data(), n, block);
    ref::quantize_blockwise(map, x.data(), ref_codes.data(), ref_absmax.data(), n, block);
    dequantize_blockwise(codec, codes.data(), absmax.data(), back.data(), n, block);
    EXPECT_EQ(absmax, ref_absmax);
    double worst_relative = 0;
    int64_t same = 0;
    for (int64_t i = 0; i < n; ++i) {
      const double a = double(absmax[size_t(i / block)]);
      if (a == 0) {
        ASSERT_EQ(back[size_t(i)], 0.0f);
        continue;
      }
      const double bound = half_gap(map, double(x[size_t(i)]) / a) * a;
      const double err = std::fabs(double(back[size_t(i)]) - double(x[size_t(i)]));
      ASSERT_LE(err, bound * (1 + 1e-5) + 1e-7 * a) << "element " << i;
      worst_relative = std::max(worst_relative, err / a);
      same += codes[size_t(i)] == ref_codes[size_t(i)];
    }
    // The largest half gap: the top decade's 0.9 / 2^6 / 2 (signed) or 0.9 / 2^7 / 2 (unsigned).
    EXPECT_LE(worst_relative, (is_signed ? 0.9 / 128 : 0.9 / 256) * (1 + 1e-5));
    EXPECT_GE(double(same), 0.999 * double(n - block));
    std::printf("%s: worst round-trip error %.3g of the block absmax; %ld of %ld codes as the reference\n",
                is_signed ? "signed" : "unsigned", worst_relative, long(same), long(n - block));
  }
}

struct Tensor8 {
  Vec p, g;
  std::vector<uint8_t> m, v;
  Vec m_absmax, v_absmax;
  float decay = 0;
  int64_t numel() const { return int64_t(p.size()); }
};

// Random tensors with a non-trivial 8-bit state: moments drawn like Adam's and quantized,
// one block of zero gradient and zero state (the padded vocabulary rows).
std::vector<Tensor8> random_tensors(int64_t block) {
  const std::vector<int64_t> sizes = {4096, 5000, 256 * 40 + 17, 70000};
  std::vector<Tensor8> ts;
  for (size_t k = 0; k < sizes.size(); ++k) {
    const size_t n = size_t(sizes[k]), blocks = (n + size_t(block) - 1) / size_t(block);
    const uint32_t seed = 100 + 10 * uint32_t(k);
    Tensor8 t;
    t.p = random_vector(n, seed, -0.1, 0.1);
    t.g = log_uniform(n, seed + 1, -6, -1, true);
    Vec m = log_uniform(n, seed + 3, -7, -2, true), v = log_uniform(n, seed + 5, -12, -4, false);
    if (k == 2) {
      std::fill(t.g.begin(), t.g.begin() + block, 0.0f);
      std::fill(m.begin(), m.begin() + block, 0.0f);
      std::fill(v.begin(), v.begin() + block, 0.0f);
    }
    t.m.resize(n), t.v.resize(n), t.m_absmax.resize(blocks), t.v_absmax.resize(blocks);
    quantize_blockwise(signed_codec(), m.data(), t.m.data(), t.m_absmax.data(), int64_t(n), block);
    quantize_blockwise(unsigned_codec(), v.data(), t.v.data(), t.v_absmax.data(), int64_t(n), block);
    t.decay = k % 2 ? 0.0f : 0.1f;
    ts.push_back(std::move(t));
  }
  return ts;
}

AdamW8bitSet make_set(std::vector<Tensor8>& ts, int64_t block) {
  std::vector<AdamW8bitTensor> views;
  for (Tensor8& t : ts)
    views.push_back({t.p.data(), t.g.data(), t.m.data(), t.v.data(), t.m_absmax.data(), t.v_absmax.data(), t.numel(),
                     t.decay});
  return AdamW8bitSet(std::move(views), block, DType::f32);
}

TEST(CpuAdamW8bit, StepsMatchTheReferenceAlgorithm) {
  const int64_t block = 256;
  std::vector<Tensor8> ts = random_tensors(block);
  const AdamW8bitSet set = make_set(ts, block);
  const QuantMap& mmap = dynamic_map_signed();
  const QuantMap& vmap = dynamic_map_unsigned();
  const float grad_scale = 0.5f;
  for (int64_t step = 1; step <= 3; ++step) {
    std::vector<Tensor8> want = ts;  // the reference starts from the kernel's state of this step
    const AdamWHyper h{1e-3 * double(step), 0.9, 0.95, 1e-8, step + 4, grad_scale};
    set.run(h);
    for (size_t k = 0; k < ts.size(); ++k) {
      Tensor8& r = want[k];
      ref::adamw8bit(r.p.data(), r.g.data(), r.m.data(), r.v.data(), r.m_absmax.data(), r.v_absmax.data(), r.numel(),
                     block, h.lr, h.beta1, h.beta2, h.eps, double(r.decay), h.step, double(grad_scale));
      const Tensor8& t = ts[k];
      // The update itself is fp32 against double: a few roundings per element.
      EXPECT_LE(normalized_error(t.p, r.p), 1e-6) << "tensor " << k << " step " << step;
      EXPECT_LE(normalized_error(t.m_absmax, r.m_absmax), 1e-6) << "tensor " << k;
      EXPECT_LE(normalized_error(t.v_absmax, r.v_absmax), 1e-6) << "tensor " << k;
      // Codes: the same, except where the fp32 moment sits within rounding of a midpoint.
      int64_t same = 0;
      for (int64_t i = 0; i < t.numel(); ++i) {
        same += t.m[size_t(i)] == r.m[size_t(i)] && t.v[size_t(i)] == r.v[size_t(i)];
        ASSERT_LE(std::abs(int(t.m[size_t(i)]) - int(r.m[size_t(i)])), 1) << "m code, element " << i;
        ASSERT_LE(std::abs(int(t.v[size_t(i)]) - int(r.v[size_t(i)])), 1) << "v code, element " << i;
        if (t.m[size_t(i)] != r.m[size_t(i)]) {
          const double y = double(mmap[r.m[size_t(i)]]), z = double(mmap[t.m[size_t(i)]]);
          EXPECT_LE(std::fabs(y - z), 2 * half_gap(mmap, std::min(y, z)) * (1 + 1e-6));
        }
        if (t.v[size_t(i)] != r.v[size_t(i)]) {
          const double y = double(vmap[r.v[size_t(i)]]), z = double(vmap[t.v[size_t(i)]]);
          EXPECT_LE(std::fabs(y - z), 2 * half_gap(vmap, std::min(y, z)) * (1 + 1e-6));
        }
      }
      EXPECT_GE(double(same), 0.999 * double(t.numel())) << "tensor " << k << " step " << step;
    }
  }
  // The all-zero block stays exactly zero: zero codes, zero absmax, parameters only decayed.
  const Tensor8& z = ts[2];
  EXPECT_EQ(z.m_absmax[0], 0.0f);
  EXPECT_EQ(z.v_absmax[0], 0.0f);
  for (int64_t i = 0; i < block; ++i) {
    ASSERT_EQ(z.m[size_t(i)], zero_code(mmap));
    ASSERT_EQ(z.v[size_t(i)], zero_code(vmap));
  }
}

TEST(CpuAdamW8bit, ResultDoesNotDependOnTheThreadCount) {
  const int64_t block = 256;
  std::vector<Tensor8> a = random_tensors(block), b = a;
  const AdamW8bitSet sa = make_set(a, block), sb = make_set(b, block);
  const int threads = omp_get_max_threads();
  omp_set_num_threads(1);
  sa.run(AdamWHyper{1e-3, 0.9, 0.999, 1e-8, 1});
  omp_set_num_threads(std::max(2, threads));
  sb.run(AdamWHyper{1e-3, 0.9, 0.999, 1e-8, 1});
  omp_set_num_threads(threads);
  for (size_t k = 0; k < a.size(); ++k) {
    EXPECT_EQ(a[k].p, b[k].p);
    EXPECT_EQ(a[k].m, b[k].m);
    EXPECT_EQ(a[k].v, b[k].v);
    EXPECT_EQ(a[k].m_absmax, b[k].m_absmax);
  }
}

TEST(CpuGradNorm, MatchesDoubleReferenceForAnyThreadCountAndUnscales) {
  const std::vector<int64_t> sizes = {1, 0, 3, 40000, 100003, 17};
  std::vector<Vec> g;
  std::vector<GradNormTensor> ts;
  std::vector<const float*> ptrs;
  for (size_t i = 0; i < sizes.size(); ++i) {
    g.push_back(random_vector(size_t(sizes[i]), 50 + uint32_t(i), -3, 3));
    ts.push_back({g.back().data(), sizes[i]});
  }
  for (const Vec& x : g) ptrs.push_back(x.data());
  const GradNormSet set(ts, 1000, DType::f32);
  ASSERT_EQ(set.chunks(), (140024 + 999) / 1000);
  Vec partials(size_t(set.chunks()));
  const double want = ref::global_norm(ptrs, sizes);
  const int threads = omp_get_max_threads();
  omp_set_num_threads(1);
  const float one = set.run(partials.data(), 1.0f);
  omp_set_num_threads(std::max(2, threads));
  const float two = set.run(partials.data(), 1.0f);
  omp_set_num_threads(threads);
  EXPECT_EQ(one, two);
  EXPECT_NEAR(one, want, 1e-6 * want);
  // Gradients carrying a loss scale of 1024: the norm of the unscaled ones.
  for (Vec& x : g)
    for (float& e : x) e *= 1024.0f;
  EXPECT_NEAR(set.run(partials.data(), 1.0f / 1024), want, 1e-6 * want);
}

TEST(GradientClipping, CoefficientIsPyTorchs) {
  EXPECT_EQ(clip_coefficient(10.0f, 0.0), 1.0f);
  EXPECT_EQ(clip_coefficient(0.5f, 1.0), 1.0f);
  EXPECT_FLOAT_EQ(clip_coefficient(10.0f, 1.0), 1.0f / (10.0f + 1e-6f));
  EXPECT_FLOAT_EQ(clip_coefficient(4.0f, 2.0), 0.5f);
}

// adamw and grad_norm as the program uses them: the norm op writes the scalar the update op
// reads, and both see gradients carrying a loss scale of 8.
// On every backend (kernels/backend.hpp).
class ClippingOnBackend : public ::testing::TestWithParam<std::string> {};
INSTANTIATE_TEST_SUITE_P(Backends, ClippingOnBackend, ::testing::Values("cpu", "reference"),
                         [](const ::testing::TestParamInfo<std::string>& info) { return info.param; });

TEST_P(ClippingOnBackend, ClippedAdamWStepMatchesReferenceOnScaledGradients) {
  auto backend = make_backend(GetParam());
  test::ProgramFixture f;
  const std::vector<int64_t> sizes = {700, 33};
  std::vector<TensorId> grads, outs;
  std::vector<Vec> p0, g0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    grads.push_back(f.tensor(fmt::format("g{}", i), {sizes[i]}));
    p0.push_back(random_vector(size_t(sizes[i]), 60 + uint32_t(i)));
    g0.push_back(random_vector(size_t(sizes[i]), 70 + uint32_t(i)));
  }
  for (const char* role : {"p", "m", "v"})
    for (size_t i = 0; i < sizes.size(); ++i) outs.push_back(f.tensor(role + std::to_string(i), {sizes[i]}));
  const TensorId norm = f.tensor("norm", {1}), partials = f.tensor("partials", {4});
  const float loss_scale = 8;
  for (size_t i = 0; i < sizes.size(); ++i) {
    Vec scaled = g0[i];
    for (float& x : scaled) x *= loss_scale;
    f.set(grads[i], scaled);
    f.set(outs[i], p0[i]);
  }
  AdamWAttrs a;
  a.max_grad_norm = 1.0;
  a.weight_decay = {0.1f, 0.0f};
  GradNormAttrs na;
  na.chunk = 256;
  std::vector<TensorId> inputs = grads;
  inputs.push_back(norm);
  const int norm_op = f.op(OpKind::grad_norm, grads, {norm}, na, {WriteMode::overwrite}, {partials});
  const int adam_op = f.op(OpKind::adamw, inputs, outs, a, std::vector<WriteMode>(outs.size(), WriteMode::update));
  auto run_norm = f.prepare(*backend, norm_op);
  auto run_adam = f.prepare(*backend, adam_op);
  StepContext ctx;
  ctx.lr = 1e-2;
  ctx.loss_scale = loss_scale;
  run_norm->run(ctx);
  run_adam->run(ctx);

  std::vector<const float*> ptrs = {g0[0].data(), g0[1].data()};
  const double total = ref::global_norm(ptrs, sizes);
  ASSERT_GT(total, 1.0);  // so the clip is active
  EXPECT_NEAR(f.get(norm)[0], total, 1e-6 * total);
  const double coef = 1.0 / (total + 1e-6);
  for (size_t i = 0; i < sizes.size(); ++i) {
    Vec p = p0[i], m(size_t(sizes[i]), 0.0f), v = m, g = g0[i];
    for (float& x : g) x = float(double(x) * coef);
    ref::adamw(p.data(), g.data(), m.data(), v.data(), sizes[i], ctx.lr, 0.9, 0.999, 1e-8, double(a.weight_decay[i]), 1);
    EXPECT_LE(normalized_error(f.get(outs[i]), p), 1e-6) << "tensor " << i;
    EXPECT_LE(normalized_error(f.get(outs[2 + i]), m), 1e-5) << "tensor " << i;
    EXPECT_LE(normalized_error(f.get(outs[4 + i]), v), 1e-5) << "tensor " << i;
  }
}

}  // namespace
}  // namespace memfit
