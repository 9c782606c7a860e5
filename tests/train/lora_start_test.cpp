// LoRA starts that rewrite the base (init_lora_weights olora, pissa, pissa_niter_N):
// - the factors against closed forms: PiSSA on a weight built from a known SVD recovers its top
//   r triplets, and OLoRA's B A is the projection of W onto its first r columns' span (a
//   Gram-Schmidt reference), B orthonormal;
// - against PEFT (tools/make_lora_start_fixtures.py): the started A and B (PiSSA's up to each
//   pair's sign), the first loss and every adapter gradient, three AdamW steps; PEFT's saved
//   start loads on the rewritten base; merge-lora of the started adapter gives back the base;
// - the CLI: the first loss is the base model's, planned == measured, and the refusals.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include "core/error.hpp"
#include "core/half.hpp"
#include "graph/lora.hpp"
#include "graph/quantize_base.hpp"
#include "graph/training_program.hpp"
#include "io/safetensors.hpp"
#include "kernels/quant/blockwise.hpp"
#include "kernels/quant/quant_segments.hpp"
#include "support/adapter_run.hpp"
#include "support/paths.hpp"
#include "support/run_cli.hpp"
#include "support/tensor_values.hpp"
#include "train/adapter_files.hpp"
#include "train/lora_start_factors.hpp"
#include "train/master_weights.hpp"
#include "train/quantized_weights.hpp"
#include "train/rng.hpp"

namespace memfit {
namespace {

namespace fs = std::filesystem;

std::vector<float> gaussian(int64_t n, uint64_t seed) {
  Rng rng(seed);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = float(rng.normal());
  return v;
}

// Modified Gram-Schmidt (double) of the k columns of q [n, k], in place: an independent QR.
void gram_schmidt(std::vector<double>& q, int64_t n, int64_t k) {
  for (int64_t j = 0; j < k; ++j) {
    for (int64_t p = 0; p < j; ++p) {
      double d = 0;
      for (int64_t i = 0; i < n; ++i) d += q[size_t(i * k + p)] * q[size_t(i * k + j)];
      for (int64_t i = 0; i < n; ++i) q[size_t(i * k + j)] -= d * q[size_t(i * k + p)];
    }
    double norm = 0;
    for (int64_t i = 0; i < n; ++i) norm += q[size_t(i * k + j)] * q[size_t(i * k + j)];
    for (int64_t i = 0; i < n; ++i) q[size_t(i * k + j)] /= std::sqrt(norm);
  }
}

// Orthonormal columns [n, k] from a Gaussian draw.
std::vector<double> orthonormal(int64_t n, int64_t k, uint64_t seed) {
  const std::vector<float> g = gaussian(n * k, seed);
  std::vector<double> q(g.begin(), g.end());
  gram_schmidt(q, n, k);
  return q;
}

WeightRows rows_of(const std::vector<float>& w, int64_t cols) {
  return [&w, cols](int64_t first, int64_t count, std::span<float> out) {
    std::copy_n(w.data() + first * cols, count * cols, out.data());
  };
}

// scale B A [rows, cols].
std::vector<double> product(const LowRankFactors& f, int64_t rows, int64_t cols, double scale) {
  std::vector<double> m(size_t(rows * cols), 0.0);
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j)
      for (int64_t k = 0; k < f.rank; ++k)
        m[size_t(i * cols + j)] += scale * double(f.b[size_t(i * f.rank + k)]) * f.a[size_t(k * cols + j)];
  return m;
}

TEST(LoraStartFactors, PissaRecoversTheTopTripletsOfAKnownSpectrum) {
  const int64_t rows = 48, cols = 80, r = 4, n = 40;
  const std::vector<double> u = orthonormal(rows, n, 1), v = orthonormal(cols, n, 2);
  std::vector<double> sigma(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) sigma[size_t(i)] = 10.0 * std::pow(0.85, double(i));
  std::vector<float> w(static_cast<size_t>(rows * cols));
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) {
      double s = 0;
      for (int64_t k = 0; k < n; ++k) s += u[size_t(i * n + k)] * sigma[size_t(k)] * v[size_t(j * n + k)];
      w[size_t(i * cols + j)] = float(s);
    }
  const double scale = 2.0;
  // Largest distance of scale B A from the top r triplets' U_r S_r V_r^T.
  auto distance_from_top = [&](const LowRankFactors& f) {
    const std::vector<double> got = product(f, rows, cols, scale);
    double err = 0;
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < cols; ++j) {
        double want = 0;
        for (int64_t k = 0; k < r; ++k) want += u[size_t(i * n + k)] * sigma[size_t(k)] * v[size_t(j * n + k)];
        err = std::max(err, std::fabs(got[size_t(i * cols + j)] - want));
      }
    return err;
  };
  for (int64_t chunk : {int64_t(5), rows}) {
    const LowRankFactors f = pissa_factors({rows, cols, r, chunk}, scale, -1, 7, rows_of(w, cols), "w");
    EXPECT_LT(distance_from_top(f), 2e-5 * sigma[0]) << "chunk " << chunk;
    // A's rows are sqrt(sigma_i / scale) times unit right vectors.
    for (int64_t k = 0; k < r; ++k) {
      double norm = 0;
      for (int64_t j = 0; j < cols; ++j) norm += double(f.a[size_t(k * cols + j)]) * f.a[size_t(k * cols + j)];
      EXPECT_NEAR(norm, sigma[size_t(k)] / scale, 1e-4 * sigma[0]) << k;
    }
  }
  // Two power iterations from r columns (pissa_niter_2) are near, not at, the top triplets.
  const double err =
      distance_from_top(pissa_factors({rows, cols, r, rows}, scale, 2, 7, rows_of(w, cols), "w"));
  EXPECT_GT(err, 1e-4 * sigma[0]);
  EXPECT_LT(err, 0.5 * sigma[0]);
}

TEST(LoraStartFactors, PissaOnATiedSpectrumStillLeavesTheSmallestResidual) {
  // sigma_4 == sigma_5: the top 4 singular vectors are not unique (PEFT's SVD picks one), but any
  // choice leaves a residual of sum_{i > 4} sigma_i^2.
  const int64_t rows = 16, cols = 16, r = 4;
  std::vector<float> w(static_cast<size_t>(rows * cols), 0.0f);
  double rest = 0;
  for (int64_t i = 0; i < rows; ++i) {
    const float s = i < 3 ? float(10 - i) : 1.0f;
    w[size_t(i * cols + i)] = s;
    if (i >= r) rest += double(s) * s;
  }
  const LowRankFactors f = pissa_factors({rows, cols, r, rows}, 1.0, -1, 3, rows_of(w, cols), "w");
  std::vector<float> residual = w;
  subtract_low_rank(residual, 0, rows, cols, f, 1.0);
  double sum = 0;
  for (float v : residual) sum += double(v) * v;
  EXPECT_NEAR(sum, rest, 1e-4 * rest);
}

TEST(LoraStartFactors, OloraIsTheProjectionOntoTheFirstColumnsWithOrthonormalB) {
  const int64_t rows = 40, cols = 24, r = 3;
  const std::vector<float> w = gaussian(rows * cols, 5);
  const LowRankFactors f = olora_factors({rows, cols, r, 7}, rows_of(w, cols));
  // Reference: Gram-Schmidt of W's first r columns, then Q Q^T W.
  std::vector<double> q(static_cast<size_t>(rows * r));
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < r; ++j) q[size_t(i * r + j)] = w[size_t(i * cols + j)];
  gram_schmidt(q, rows, r);
  const std::vector<double> got = product(f, rows, cols, 1.0);
  double err = 0;
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) {
      double want = 0;
      for (int64_t k = 0; k < r; ++k)
        for (int64_t m = 0; m < rows; ++m)
          want += q[size_t(i * r + k)] * q[size_t(m * r + k)] * w[size_t(m * cols + j)];
      err = std::max(err, std::fabs(got[size_t(i * cols + j)] - want));
    }
  EXPECT_LT(err, 1e-5);
  for (int64_t a = 0; a < r; ++a)
    for (int64_t b = 0; b < r; ++b) {
      double d = 0;
      for (int64_t i = 0; i < rows; ++i) d += double(f.b[size_t(i * r + a)]) * f.b[size_t(i * r + b)];
      EXPECT_NEAR(d, a == b ? 1.0 : 0.0, 1e-5) << a << "," << b;
    }
  // A's first r columns are R's upper triangle.
  for (int64_t i = 1; i < r; ++i)
    for (int64_t j = 0; j < i; ++j) EXPECT_EQ(f.a[size_t(i * cols + j)], 0.0f);
}

// Largest |a - s b| over the largest |b|, s each row's sign (rows of `cols` elements) or 1.
double aligned_error(std::span<const float> a, std::span<const float> b, const std::vector<double>& sign,
                     bool by_rows, int64_t rank) {
  double err = 0, scale = 0;
  for (size_t i = 0; i < b.size(); ++i) {
    const size_t component = by_rows ? i / (b.size() / size_t(rank)) : i % size_t(rank);
    err = std::max(err, std::fabs(double(a[i]) - sign[component] * b[i]));
    scale = std::max(scale, double(std::fabs(b[i])));
  }
  return err / scale;
}

std::vector<float> read_all(const SafetensorsReader& r, const std::string& name) {
  const SafetensorsEntry* e = r.find(name);
  EXPECT_NE(e, nullptr) << name;
  if (!e) return {};
  std::vector<float> v(static_cast<size_t>(e->shape.numel()));
  r.read_f32(name, e->shape, v.data());
  return v;
}

Policy fixture_policy() {
  Policy pol;
  pol.adamw = AdamWConfig{0.9f, 0.999f, 1e-8f, 0.1f};
  return pol;
}

class LoraStartParity : public ::testing::TestWithParam<const char*> {
 protected:
  std::string family = GetParam();
  std::string base = family.substr(0, family.find('_')) + "_tiny_torch";
  std::string adapter = test::fixture_path("lora_start_" + family + "_tiny_torch");
  SafetensorsReader expected{adapter + "/expected.safetensors"};
  SafetensorsReader peft{adapter + "/adapter_model.safetensors"};
  test::AdapterRun run{test::fixture_path(base), adapter, fixture_policy(), false};  // memfit's own start
  bool pissa = family.ends_with("_pissa");

  // Each PiSSA pair's sign against PEFT's (the SVD leaves it free); OLoRA's are fixed.
  std::vector<double> signs(const std::string& a_name) {
    const std::vector<float> ours = test::tensor_values<float>(*run.ex, run.compiled.program.find_tensor(a_name));
    const std::vector<float> theirs = read_all(peft, peft_tensor_name(run.spec, a_name));
    const size_t per = theirs.size() / 4;
    std::vector<double> s(4, 1.0);
    for (size_t k = 0; k < 4 && pissa; ++k) {
      double d = 0;
      for (size_t j = 0; j < per; ++j) d += double(ours[k * per + j]) * theirs[k * per + j];
      s[k] = d < 0 ? -1.0 : 1.0;
    }
    return s;
  }
};

TEST_P(LoraStartParity, TheStartAndTheFirstStepMatchPeft) {
  std::map<std::string, std::vector<double>> sign;  // by module
  int compared = 0;
  double worst = 0;
  for (const ParamEntry& e : run.compiled.program.params()) {
    if (!is_lora_adapter(e.name)) continue;
    const std::string module = e.name.substr(0, e.name.rfind(".lora_"));
    if (!sign.count(module)) sign[module] = signs(module + ".lora_A.weight");
    const std::vector<float> ours = test::tensor_values<float>(*run.ex, e.value);
    const double err = aligned_error(ours, read_all(peft, peft_tensor_name(run.spec, e.name)), sign[module],
                                     e.name.ends_with(".lora_A.weight"), 4);
    EXPECT_LE(err, 1e-4) << e.name;
    worst = std::max(worst, err);
    ++compared;
  }
  EXPECT_EQ(compared, int(peft.entries().size()));
  std::printf("started adapters: %d tensors, largest normalised error %.3g\n", compared, worst);
  std::vector<float> ref(1);
  expected.read_f32("loss", Shape{}, ref.data());
  const float loss = run.micro_step();
  EXPECT_NEAR(loss, ref[0], 1e-5 * ref[0]);
  worst = 0;
  for (const ParamEntry& e : run.compiled.program.params()) {
    if (e.grad == kNoTensor) continue;
    const std::string module = e.name.substr(0, e.name.rfind(".lora_"));
    const double err = aligned_error(test::tensor_values<float>(*run.ex, e.grad),
                                     read_all(expected, "grad." + peft_tensor_name(run.spec, e.name)), sign[module],
                                     e.name.ends_with(".lora_A.weight"), 4);
    EXPECT_LE(err, 1e-4) << e.name;
    worst = std::max(worst, err);
  }
  std::printf("first loss: memfit %.7f, PEFT %.7f; gradients' largest normalised error %.3g\n", loss, ref[0], worst);
}

TEST_P(LoraStartParity, ThreeAdamWStepsMatchPeftAndTheSavedAdapterStartsAgainOnLoading) {
  std::vector<float> ref(4);
  expected.read_f32("losses_adamw", Shape{4}, ref.data());
  const std::vector<float> losses = run.optimizer_steps(3, 1e-3f);
  for (size_t i = 0; i < losses.size(); ++i) EXPECT_NEAR(losses[i], ref[i], 1e-5 * ref[i]) << "before update " << i + 1;
  const float after = run.micro_step();
  EXPECT_NEAR(after, ref[3], 1e-5 * ref[3]);
  std::printf("after 3 updates: memfit %.7f, PEFT %.7f\n", after, ref[3]);
  // Saved, the adapter names its start; loaded, the base is rewritten again under it.
  const std::string out = test::temp_dir() + "/adapter";
  save_adapter(out, *run.ex, run.spec, run.lora, base, run.staging);
  EXPECT_NE(test::read_file(out + "/adapter_config.json").find(pissa ? "\"pissa\"" : "\"olora\""), std::string::npos);
  test::AdapterRun reloaded(test::fixture_path(base), out, fixture_policy());
  EXPECT_EQ(reloaded.micro_step(), after);
  // convert-lora: the same model as a rank-2r plain LoRA of the untouched base.
  const std::string converted = test::temp_dir() + "/converted";
  const test::CliResult c = test::run_memfit("convert-lora --model " + test::fixture_path(base) + " --load " +
                                             test::fixture_path(base) + " --adapter " + out + " --out " + converted);
  ASSERT_EQ(c.status, 0) << c.err;
  const std::string config = test::read_file(converted + "/adapter_config.json");
  EXPECT_NE(config.find("\"init_lora_weights\": true"), std::string::npos) << config;
  EXPECT_NE(config.find("\"r\": 8"), std::string::npos) << config;
  EXPECT_NE(config.find("\"lora_alpha\": 16"), std::string::npos) << config;
  test::AdapterRun as_lora(test::fixture_path(base), converted, fixture_policy());
  EXPECT_NEAR(as_lora.micro_step(), after, 2e-6 * after);
  // PEFT's own saved start, loaded the same way, is PEFT's first step.
  test::AdapterRun theirs(test::fixture_path(base), adapter, fixture_policy());
  EXPECT_NEAR(theirs.micro_step(), ref[0], 1e-5 * ref[0]);
}

TEST_P(LoraStartParity, MergingTheStartedAdapterGivesBackTheBase) {
  const std::string base_dir = test::fixture_path(base), out = test::temp_dir() + "/merged";
  const test::CliResult r = test::run_memfit("merge-lora --model " + base_dir + " --load " + base_dir +
                                             " --adapter " + adapter + " --out " + out);
  ASSERT_EQ(r.status, 0) << r.out << r.err;
  const SafetensorsReader merged(out + "/model.safetensors"), w(base_dir + "/model.safetensors");
  int adapted = 0;
  for (const SafetensorsEntry& e : w.entries()) {
    const std::string name = base == "gpt2_tiny_torch" && !e.name.starts_with("transformer.") ? "transformer." + e.name
                                                                                              : e.name;
    const std::vector<float> want = read_all(w, e.name), got = read_all(merged, name);
    ASSERT_EQ(got.size(), want.size()) << name;
    double err = 0, scale = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      err = std::max(err, double(std::fabs(got[i] - want[i])));
      scale = std::max(scale, double(std::fabs(want[i])));
    }
    // (W - scale B A) + scale B A: OLoRA's QR is PEFT's to rounding; PiSSA's start agrees with
    // PEFT's SVD to ~5e-5 of the adapter's size (the first test), so to ~1e-4 of W here.
    EXPECT_LE(err, (pissa ? 1e-4 : 1e-5) * scale) << name;
    adapted += peft.find("base_model.model." + name.substr(0, name.size() - 7) + ".lora_A.weight") != nullptr;
  }
  EXPECT_EQ(adapted, int(peft.entries().size()) / 2);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, LoraStartParity, ::testing::Values("llama_olora", "llama_pissa", "gpt2_pissa"),
                         [](const auto& info) { return std::string(info.param); });

// QPiSSA / QOLoRA: a quantised base starts from its float values as they are quantised, so NF4
// holds the residual, and W - (dequantised base + scale B A) is the residual's quantisation
// error: for PiSSA smaller than plain QLoRA's W - dequantised W, by the share of W that B A
// carries (QPiSSA's point; a start made from the dequantised base would keep W's whole error).
class LoraStartQuantized : public ::testing::TestWithParam<const char*> {};

const ParamEntry* param_of(const Program& p, const std::string& name) {
  const ParamEntry* e = p.find_param(name);
  if (e == nullptr) ADD_FAILURE() << "no parameter " << name;
  return e != nullptr ? e : &p.params().front();
}

TEST_P(LoraStartQuantized, TheResidualIsWhatIsQuantisedAndWsErrorShrinks) {
  Policy pol = fixture_policy();
  pol.precision = Precision::bf16;
  pol.attention = AttentionKind::flash;
  pol.quantize_base = BaseQuantPolicy{BaseQuant::nf4, 64, true};
  const std::string base = test::fixture_path("llama_tiny_torch");
  test::AdapterRun started(base, test::fixture_path(std::string("lora_start_") + GetParam() + "_tiny_torch"), pol,
                           false);
  test::AdapterRun plain(base, test::fixture_path("lora_llama_tiny_torch"), pol);
  const SafetensorsReader hf(base + "/model.safetensors");
  const Program& p = started.compiled.program;
  double err_started = 0, err_plain = 0, adapter_share = 0;
  int modules = 0;
  int64_t codes = 0, codes_differ = 0;
  for (const LinearModule& m : lora_targets(p, started.lora)) {
    const std::string hf_name = "model." + m.name + ".weight";
    std::vector<float> w = read_all(hf, hf_name);
    for (float& v : w) v = widen(narrow<bf16_t>(v));  // the bf16 model PEFT would start
    auto param_values = [&](test::AdapterRun& r, const std::string& name) {
      const ParamEntry* e = param_of(r.compiled.program, name);
      std::vector<float> v(static_cast<size_t>(r.compiled.program.tensor(e->value).numel()));
      load_parameter_range(*r.ex, *e, 0, v, r.staging);
      return v;
    };
    const std::vector<float> a = param_values(started, lora_a_name(m.name));
    const std::vector<float> b = param_values(started, lora_b_name(m.name));
    const int64_t r = int64_t(a.size()) / m.cols;
    // Each run's dequantised piece (llama's q, v are pieces of the fused weight).
    auto dequantised = [&](test::AdapterRun& run) {
      const Program& rp = run.compiled.program;
      const ParamEntry* e = param_of(rp, m.weight);
      const QuantizedParam qp = quantized_param_of(rp, *e);
      size_t piece = 0;
      for (int64_t rows = 0; rows < m.row_begin; ++piece) rows += qp.segments[piece];
      std::vector<float> out(static_cast<size_t>(m.rows * m.cols));
      read_dequantized_rows(*run.ex, *e, piece, [&](int64_t first, int64_t rows, std::span<const float> v) {
        std::copy_n(v.data(), rows * m.cols, out.data() + first * m.cols);
      }, run.staging);
      return out;
    };
    const std::vector<float> q_started = dequantised(started), q_plain = dequantised(plain);
    // The piece's codes are those of bf16(W - scale B A) quantised here (fp32 sums in another
    // order may round a few elements to the neighbouring bf16).
    std::vector<bf16_t> residual(w.size());
    for (int64_t i = 0; i < m.rows; ++i)
      for (int64_t j = 0; j < m.cols; ++j) {
        double d = 0;
        for (int64_t k = 0; k < r; ++k) d += double(b[size_t(i * r + k)]) * a[size_t(k * m.cols + j)];
        residual[size_t(i * m.cols + j)] = narrow<bf16_t>(float(w[size_t(i * m.cols + j)] - 2.0 * d));
      }
    {
      const ParamEntry* e = param_of(p, m.weight);
      const QuantizedParam qp = quantized_param_of(p, *e);
      size_t piece = 0;
      for (int64_t rows = 0; rows < m.row_begin; ++piece) rows += qp.segments[piece];
      std::vector<uint8_t> want((residual.size() + 1) / 2), got(want.size());
      std::vector<float> absmax(static_cast<size_t>(quant_blocks(int64_t(residual.size()), 64)));
      quantize_4bit<bf16_t>(residual, QuantSpec{QuantKind::nf4, 64, false}, want, absmax);
      started.ex->read(qp.codes, segment_offset(qp.spec, qp.cols, qp.segments, piece).codes,
                       std::as_writable_bytes(std::span<uint8_t>(got)));
      int64_t differ = 0;
      for (size_t i = 0; i < want.size(); ++i) differ += (want[i] & 15) != (got[i] & 15);
      for (size_t i = 0; i < want.size(); ++i) differ += (want[i] >> 4) != (got[i] >> 4);
      EXPECT_LE(differ, int64_t(residual.size()) / 1000) << m.name;
      codes_differ += differ;
      codes += int64_t(residual.size());
    }
    double e1 = 0, e2 = 0, ba = 0;
    for (int64_t i = 0; i < m.rows; ++i)
      for (int64_t j = 0; j < m.cols; ++j) {
        double d = 0;
        for (int64_t k = 0; k < r; ++k) d += double(b[size_t(i * r + k)]) * a[size_t(k * m.cols + j)];
        d *= 2.0;  // alpha / r = 8 / 4
        const double x = w[size_t(i * m.cols + j)];
        e1 += std::pow(x - (q_started[size_t(i * m.cols + j)] + d), 2);
        e2 += std::pow(x - q_plain[size_t(i * m.cols + j)], 2);
        ba += d * d;
      }
    err_started += e1, err_plain += e2, adapter_share += ba;
    ++modules;
  }
  std::printf("%s on NF4: ||W - (Q(W - sBA) + sBA)||^2 %.4g against QLoRA's ||W - Q(W)||^2 %.4g (ratio %.3f); "
              "||sBA||^2 %.4g over %d modules\n", GetParam(), err_started, err_plain, err_started / err_plain,
              adapter_share, modules);
  std::printf("%lld of %lld codes differ from quantising bf16(W - sBA) here\n", (long long)codes_differ,
              (long long)codes);
  EXPECT_EQ(modules, 6);
  // PiSSA takes W's top energy out before quantising; PEFT's OLoRA subtracts scale Q_r R_r, which
  // at scale 2 reflects W's part in span(Q_r) instead of removing it, so its residual is as large
  // as W and its error is QLoRA's.
  EXPECT_LT(err_started, (std::string(GetParam()) == "llama_pissa" ? 0.9 : 1.05) * err_plain);
  EXPECT_LT(err_started, 0.1 * adapter_share);  // B A is in the sum: without it W would be far off
}

INSTANTIATE_TEST_SUITE_P(Fixtures, LoraStartQuantized, ::testing::Values("llama_pissa", "llama_olora"),
                         [](const auto& info) { return std::string(info.param); });

TEST(LoraStartRun, TheFirstLossIsTheBaseModelsAndThePlanHolds) {
  const std::string common = "train --model llama-tiny --lora-rank 4 --lora-targets all-linear --steps 2 "
                             "--val-fraction 0 --lora-init ";
  auto first_loss = [](const std::string& out) { return out.substr(out.find("loss ") + 5, 7); };
  const test::CliResult plain = test::run_memfit(common + "true");
  ASSERT_EQ(plain.status, 0) << plain.err;
  for (const char* init : {"olora", "pissa", "pissa_niter_4"}) {
    const test::CliResult r = test::run_memfit(common + init);
    ASSERT_EQ(r.status, 0) << init << ": " << r.err;
    EXPECT_EQ(first_loss(r.out), first_loss(plain.out)) << init;
    EXPECT_NE(r.out.find(", equal;"), std::string::npos) << init << r.out;
    EXPECT_NE(r.out.find("within 2% + 25 MiB"), std::string::npos) << init << r.out;
  }
  // On an NF4 base (QPiSSA) the start is made as the base is quantised: the plan holds too.
  const test::CliResult q = test::run_memfit(common + "pissa --quantize-base nf4 --double-quant");
  ASSERT_EQ(q.status, 0) << q.err;
  EXPECT_NE(q.out.find(", equal;"), std::string::npos) << q.out;
  EXPECT_NE(q.out.find("within 2% + 25 MiB"), std::string::npos) << q.out;
}

// pissa_niter_N's start is a draw from the run's seed, which the saved adapter records: loading
// it (memfit's --load-adapter), merging it and converting it rebuild the same residual whatever
// --seed they are given; without the record the residual would differ.
TEST(LoraStartRun, ADrawnStartKeepsItsSeedWithTheAdapter) {
  const std::string base = test::fixture_path("llama_tiny_torch"), dir = test::temp_dir(), saved = dir + "/niter";
  const test::CliResult r = test::run_memfit(
      "train --model " + base + " --load " + base + " --lora-rank 4 --lora-targets q_proj,v_proj --lora-init "
      "pissa_niter_2 --seed 7 --steps 2 --lr 1e-2 --batch 2 --seq 16 --val-fraction 0 --save " + saved);
  ASSERT_EQ(r.status, 0) << r.err;
  const std::string config = test::read_file(saved + "/adapter_config.json");
  EXPECT_NE(config.find("\"memfit_start_seed\": 7"), std::string::npos) << config;
  EXPECT_NE(config.find("\"init_lora_weights\": \"pissa_niter_2\""), std::string::npos) << config;
  test::AdapterRun loaded(base, saved, fixture_policy());  // its own seed is 0: the file's 7 is taken
  const float loss = loaded.micro_step();
  const test::CliResult c = test::run_memfit("convert-lora --model " + base + " --load " + base + " --adapter " + saved +
                                             " --out " + dir + "/plain");
  ASSERT_EQ(c.status, 0) << c.err;
  test::AdapterRun plain(base, dir + "/plain", fixture_policy());
  EXPECT_NEAR(plain.micro_step(), loss, 2e-6 * loss);
  // The same adapter with the record removed starts from seed 0: another residual, another loss.
  const std::string unrecorded = dir + "/unrecorded";
  fs::create_directories(unrecorded);
  fs::copy_file(saved + "/adapter_model.safetensors", unrecorded + "/adapter_model.safetensors");
  std::string stripped = config;
  const size_t at = stripped.find("\"memfit_start_seed\"");
  stripped.erase(at, stripped.find('\n', at) - at + 1);
  test::write_file(unrecorded + "/adapter_config.json", stripped);
  test::AdapterRun other(base, unrecorded, fixture_policy());
  EXPECT_GT(std::fabs(other.micro_step() - loss), 1e-4 * loss);
  const test::CliResult refused = test::run_memfit("merge-lora --model " + base + " --load " + base + " --adapter " +
                                                   unrecorded + " --out " + dir + "/never");
  EXPECT_NE(refused.status, 0);
  EXPECT_NE(refused.err.find("without memfit_start_seed"), std::string::npos) << refused.err;
}

TEST(LoraStartRun, WhatItCannotStartIsRefusedInOneLine) {
  const std::string lora = " --lora-rank 4 --steps 1 --val-fraction 0";
  for (const auto& [args, words] : std::vector<std::pair<std::string, std::string>>{
           {"train --model llama-tiny --lora-init pissa_niter_x" + lora, "pissa_niter_N"},
           {"train --model llama-tiny --lora-init svd" + lora, "--lora-init 'svd'"},
           {"train --model gpt2-tiny --lora-init olora" + lora, "GPT-2's Conv1D"},
           {"convert-lora --model " + test::fixture_path("llama_tiny_torch") + " --load " +
                test::fixture_path("llama_tiny_torch") + " --adapter " + test::fixture_path("lora_llama_tiny_torch") +
                " --out " + test::temp_dir() + "/never",
            "is a LoRA adapter of its base already"}}) {
    const test::CliResult r = test::run_memfit(args);
    EXPECT_NE(r.status, 0) << args;
    EXPECT_NE(r.err.find(words), std::string::npos) << args << ": " << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  }
}

}  // namespace
}  // namespace memfit
