// LoRA (graph/lora.hpp) on gpt2-tiny and llama-tiny, against references that share no code
// with the rewrite:
// (a) with B = 0 the loss is the base model's, bit for bit; with B != 0 the loss is that of
//     the unrewritten program whose weights are merged, W' = W + (alpha / r) B A (rows of the
//     fused qkv weight for q_proj, k_proj, v_proj), and dA, dB equal the closed forms
//     s B^T dW' and s dW' A^T from the merged program's weight gradient;
// (b) a step moves only the adapters (and biases with bias = all), allocates nothing, and the
//     measured high-water equals the plan, under fp32 and bf16 + recomputation + flash;
// (c) the plan has gradients and AdamW state for exactly sum r (in + out) elements;
// (d) dropout keeps 1 - p of the elements (within 5 sigma), scales them by 1 / (1 - p), draws
//     the same mask in backward and in a recomputed forward, and the two backends agree;
// (e) bad input is refused in one line naming the problem;
// (f) DoRA's magnitudes start at the row norms of W (recomputed here), so that the first loss
//     is plain LoRA's bit for bit while B = 0, and a DoRA step moves them within the plan.
//     (Its arithmetic against PEFT: lora_parity_test's llama_dora and gpt2_dora.)
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <tuple>

#include "graph/lora.hpp"
#include "graph/training_program.hpp"
#include "kernels/cpu/columns.hpp"
#include "core/dropout_mask.hpp"
#include "core/half.hpp"
#include "support/alloc_counter.hpp"
#include "support/run_cli.hpp"
#include "support/tensor_values.hpp"
#include "support/tiny_run.hpp"
#include "train/trainer.hpp"

namespace memfit {
namespace {

Policy tiny_policy() {
  Policy p;
  p.batch = 2;
  p.seq = 32;
  p.with_eval = false;
  p.grad_accum = 2;  // persistent gradients, readable after one micro-step
  return p;
}

std::unique_ptr<test::TinyRun> one_micro_step(const std::string& model, const Policy& pol,
                                              const std::function<void(test::TinyRun&)>& before = {},
                                              bool reference = false) {
  std::unique_ptr<Backend> be = reference ? make_reference_backend() : make_cpu_backend();
  CompiledProgram compiled = compile_program(build_training_program(model_preset(model), pol, {}, be->capabilities()), *be);
  auto run = std::make_unique<test::TinyRun>(std::move(compiled), 7, ExecutorOptions{}, model, std::move(be));
  if (before) before(*run);
  StepContext ctx;
  ctx.micro_count = pol.grad_accum;
  ctx.seed = 11;
  run->ex->run_section(SectionKind::micro, ctx);
  return run;
}

const ParamEntry& param(const Program& p, const std::string& name) {
  for (const ParamEntry& e : p.params())
    if (e.name == name) return e;
  throw std::runtime_error("no parameter " + name);
}

std::vector<double> doubles(const test::TinyRun& r, TensorId id) {
  const std::vector<float> d = test::tensor_values<float>(*r.ex, id);
  return std::vector<double>(d.begin(), d.end());
}

std::vector<std::byte> loss_bytes(const test::TinyRun& r) {
  return test::tensor_bytes(*r.ex, r.compiled.program.find_tensor(kLoss));
}

// Every trained gradient of `run` against `recomputed`'s and the naive backend's
// `reference`'s: the largest difference within the tolerance times the largest element.
void expect_gradients_agree(const test::TinyRun& run, const test::TinyRun& recomputed,
                            const test::TinyRun& reference, double recompute_tol, double reference_tol) {
  for (const ParamEntry& e : run.compiled.program.params()) {
    if (e.frozen()) continue;
    const std::vector<double> g = doubles(run, e.grad);
    const std::vector<double> gr = doubles(recomputed, param(recomputed.compiled.program, e.name).grad);
    const std::vector<double> gref = doubles(reference, param(reference.compiled.program, e.name).grad);
    double scale = 0, err = 0, err_ref = 0;
    for (size_t i = 0; i < g.size(); ++i) {
      scale = std::max(scale, std::abs(g[i]));
      err = std::max(err, std::abs(g[i] - gr[i]));
      err_ref = std::max(err_ref, std::abs(g[i] - gref[i]));
    }
    EXPECT_GT(scale, 0) << e.name;
    EXPECT_LE(err, recompute_tol * scale) << e.name;
    EXPECT_LE(err_ref, reference_tol * scale) << e.name;
  }
}

void fill_adapters(test::TinyRun& r) {
  int salt = 0;
  for (const ParamEntry& e : r.compiled.program.params()) {
    if (e.name.find(".lora_") == std::string::npos) continue;
    std::vector<float> x(size_t(r.compiled.program.tensor(e.value).numel()));
    ++salt;
    for (size_t i = 0; i < x.size(); ++i) x[i] = 0.03f * float(std::sin(double(int64_t(i) * 7 + salt * 31) * 0.37));
    r.ex->write_as<float>(e.value, std::span<const float>(x));
  }
}

struct Case {
  std::string model;
  std::vector<std::string> targets;
  int64_t rank;
  double alpha;
  int modules_per_layer;
};

TEST(Lora, MatchesTheMergedWeightsLossAndGradients) {
  for (const Case& c : {Case{"gpt2-tiny", {"c_attn", "c_fc"}, 4, 8.0, 2},
                        Case{"llama-tiny", {"all-linear"}, 4, 16.0, 7},
                        Case{"llama-tiny", {"k_proj", "down_proj"}, 2, 4.0, 2}}) {
    SCOPED_TRACE(c.model + " " + c.targets[0]);
    Policy pol = tiny_policy();
    const auto base = one_micro_step(c.model, pol);
    Policy lp = pol;
    lp.lora.rank = c.rank;
    lp.lora.alpha = c.alpha;
    lp.lora.targets = c.targets;
    const double s = c.alpha / double(c.rank);
    EXPECT_EQ(loss_bytes(*base), loss_bytes(*one_micro_step(c.model, lp)));  // B = 0 adds exact zeros

    const auto lora = one_micro_step(c.model, lp, fill_adapters);
    const Program& P = lora->compiled.program;
    const std::vector<LinearModule> modules = lora_targets(P, lp.lora);
    ASSERT_EQ(int(modules.size()), c.modules_per_layer * model_preset(c.model).n_layer);
    const auto merged = one_micro_step(c.model, pol, [&](test::TinyRun& r) {
      std::map<std::string, std::vector<float>> weights;
      for (const LinearModule& m : modules) {
        const TensorId w = param(r.compiled.program, m.weight).value;
        if (!weights.count(m.weight)) weights[m.weight] = test::tensor_values<float>(*r.ex, w);
        std::vector<float>& W = weights[m.weight];
        const std::vector<double> A = doubles(*lora, param(P, lora_a_name(m.name)).value);
        const std::vector<double> B = doubles(*lora, param(P, lora_b_name(m.name)).value);
        for (int64_t o = 0; o < m.rows; ++o)
          for (int64_t i = 0; i < m.cols; ++i) {
            double acc = 0;
            for (int64_t j = 0; j < c.rank; ++j) acc += B[size_t(o * c.rank + j)] * A[size_t(j * m.cols + i)];
            W[size_t((m.row_begin + o) * m.cols + i)] += float(s * acc);
          }
      }
      for (auto& [name, W] : weights) r.ex->write_as<float>(param(r.compiled.program, name).value, std::span<const float>(W));
    });
    const float lora_loss = lora->loss(), merged_loss = merged->loss();
    EXPECT_NEAR(lora_loss, merged_loss, 1e-5 * std::abs(merged_loss));
    EXPECT_NE(lora_loss, base->loss());
    for (const LinearModule& m : modules) {
      const ParamEntry& pa = param(P, lora_a_name(m.name));
      const ParamEntry& pb = param(P, lora_b_name(m.name));
      const std::vector<double> A = doubles(*lora, pa.value), B = doubles(*lora, pb.value);
      const std::vector<double> dA = doubles(*lora, pa.grad), dB = doubles(*lora, pb.grad);
      const std::vector<double> dW = doubles(*merged, param(merged->compiled.program, m.weight).grad);
      auto dw = [&](int64_t o, int64_t i) { return dW[size_t((m.row_begin + o) * m.cols + i)]; };
      double max_ref = 0, max_err = 0;
      for (int64_t j = 0; j < c.rank; ++j)
        for (int64_t i = 0; i < m.cols; ++i) {
          double ref = 0;
          for (int64_t o = 0; o < m.rows; ++o) ref += B[size_t(o * c.rank + j)] * dw(o, i);
          max_ref = std::max(max_ref, std::abs(s * ref));
          max_err = std::max(max_err, std::abs(s * ref - dA[size_t(j * m.cols + i)]));
        }
      for (int64_t o = 0; o < m.rows; ++o)
        for (int64_t j = 0; j < c.rank; ++j) {
          double ref = 0;
          for (int64_t i = 0; i < m.cols; ++i) ref += dw(o, i) * A[size_t(j * m.cols + i)];
          max_ref = std::max(max_ref, std::abs(s * ref));
          max_err = std::max(max_err, std::abs(s * ref - dB[size_t(o * c.rank + j)]));
        }
      EXPECT_GT(max_ref, 0) << m.name;
      EXPECT_LT(max_err, 2e-3 * max_ref) << m.name;
    }
  }
}

std::map<std::string, std::vector<std::byte>> values(const Executor& ex) {
  std::map<std::string, std::vector<std::byte>> out;
  for (const ParamEntry& e : ex.program().params())
    if (e.value != kNoTensor) out[e.name] = test::tensor_bytes(ex, e.value);  // not a quantised weight
  return out;
}

// Steps 1 and 2 of `run`; step 2 allocates nothing and peaks where planned. The parameters'
// values before step 1 and after step 2.
std::pair<std::map<std::string, std::vector<std::byte>>, std::map<std::string, std::vector<std::byte>>>
two_steps_within_the_plan(test::TinyRun& run) {
  auto before = values(*run.ex);
  run.step(1);
  test::alloc_counter_start();
  run.step(2);
  EXPECT_EQ(test::alloc_counter_stop().memfit_allocations, 0);
  EXPECT_EQ(run.compiled.plan.tier(Tier::device).peak_bytes, run.ex->arena(Tier::device).measured_high_water());
  return {std::move(before), values(*run.ex)};
}

TEST(Lora, AStepMovesOnlyTheAdaptersWithinThePlan) {
  for (Precision precision : {Precision::fp32, Precision::bf16}) {
    SCOPED_TRACE(precision_name(precision));
    Policy pol = tiny_policy();
    pol.grad_accum = 1;
    pol.precision = precision;
    pol.lora.rank = 4;
    pol.lora.targets = {"all-linear"};
    pol.lora.dropout = 0.1;
    pol.lora.bias = LoraBias::all;
    if (precision == Precision::bf16) {
      pol.recompute = parse_recompute("full");
      pol.attention = AttentionKind::flash;
    }
    test::TinyRun run(test::compile_tiny(pol));
    const auto [before, after] = two_steps_within_the_plan(run);
    for (const ParamEntry& e : run.compiled.program.params()) {
      const bool trains = e.name.find(".lora_") != std::string::npos || e.name.ends_with(".bias");
      EXPECT_EQ(e.trainable, trains) << e.name;
      if (trains) EXPECT_NE(after.at(e.name), before.at(e.name)) << e.name;
      else EXPECT_EQ(after.at(e.name), before.at(e.name)) << e.name;
    }
  }
}

TEST(Lora, PlanHoldsStateForTheAdaptersOnly) {
  for (const std::string model : {"gpt2-tiny", "llama-tiny"}) {
    Policy pol = tiny_policy();
    pol.lora.rank = 8;
    pol.lora.targets = {"all-linear"};
    const Program p = build_training_program(model_preset(model), pol, {}, cpu_capabilities());
    int64_t adapter = 0;
    for (const LinearModule& m : linear_modules(p)) adapter += 8 * (m.rows + m.cols);
    EXPECT_EQ(p.trainable_parameter_count(), adapter) << model;
    int64_t state = 0, grads = 0;
    for (const ParamEntry& e : p.params()) {
      if (e.frozen()) {
        EXPECT_EQ(e.grad, kNoTensor) << e.name;
        EXPECT_TRUE(e.state.empty()) << e.name;
        continue;
      }
      grads += p.tensor(e.grad).numel();
      for (TensorId s : e.state) state += int64_t(p.tensor(s).bytes());
    }
    EXPECT_EQ(grads, adapter) << model;
    EXPECT_EQ(state, 8 * adapter) << model;  // AdamW m and v in fp32
  }
}

// PEFT's init_lora_weights: true draws A from U(+-1/sqrt(in)) and B = 0; "gaussian" A from
// N(0, 1/r^2) and B = 0; false also draws B, from U(+-1/sqrt(r)), so the first loss moves off
// the base model's. Oracle: the bounds and moments of those distributions.
TEST(Lora, InitialisationIsPeftsInitLoraWeights) {
  Policy pol = tiny_policy();
  pol.lora.rank = 8;
  pol.lora.targets = {"c_fc"};  // A [8, in], B [out, 8] in each of gpt2-tiny's layers
  const float base = one_micro_step("gpt2-tiny", Policy(tiny_policy()))->loss();
  for (LoraInit init : {LoraInit::peft_default, LoraInit::gaussian, LoraInit::random}) {
    pol.lora.init = init;
    const auto r = one_micro_step("gpt2-tiny", pol);
    const Program& p = r->compiled.program;
    const std::vector<double> a = doubles(*r, param(p, "h.0.mlp.c_fc.lora_A.weight").value);
    const std::vector<double> b = doubles(*r, param(p, "h.0.mlp.c_fc.lora_B.weight").value);
    double a_max = 0, a_sq = 0, b_max = 0;
    for (double v : a) a_max = std::max(a_max, std::fabs(v)), a_sq += v * v;
    for (double v : b) b_max = std::max(b_max, std::fabs(v));
    const double a_std = std::sqrt(a_sq / double(a.size())), in = double(a.size()) / 8;
    if (init == LoraInit::gaussian) {
      EXPECT_NEAR(a_std, 1.0 / 8, 0.1 / 8);     // 8 x in draws: the std within 10%
      EXPECT_GT(a_max, 1.0 / std::sqrt(in));  // past the uniform bound: not U(+-1/sqrt(in))
    } else {
      EXPECT_LE(a_max, 1.0 / std::sqrt(in));
      EXPECT_NEAR(a_std, 1.0 / std::sqrt(3.0 * in), 0.1 / std::sqrt(3.0 * in));  // U(+-c): std c / sqrt(3)
    }
    if (init == LoraInit::random) {
      EXPECT_LE(b_max, 1.0 / std::sqrt(8.0));
      EXPECT_GT(b_max, 0.9 / std::sqrt(8.0));
      EXPECT_NE(r->loss(), base);
    } else {
      EXPECT_EQ(b_max, 0.0);
      EXPECT_EQ(r->loss(), base);  // B = 0: the base model's loss exactly
    }
  }
}

TEST(Lora, DropoutKeepsOneMinusPScaledAndRedrawsTheSameMask) {
  const int64_t n = 200000;
  const float p = 0.3f;
  std::vector<float> x(static_cast<size_t>(n), 1.0f), y(static_cast<size_t>(n)), dx(static_cast<size_t>(n));
  const uint64_t key = dropout_key(5, 3, 1, dropout_salt("site"));
  dropout_apply(x.data(), y.data(), n, p, key, DropoutLayout{}, false);
  int64_t kept = 0;
  for (float v : y) {
    ASSERT_TRUE(v == 0.0f || std::abs(v - 1.0f / 0.7f) < 1e-6f);
    kept += v != 0.0f;
  }
  const double sigma = std::sqrt(double(n) * p * (1 - p));
  EXPECT_NEAR(double(kept), double(n) * (1 - p), 5 * sigma);
  dropout_apply(y.data(), dx.data(), n, p, key, DropoutLayout{}, false);  // the backward's mask: the same elements
  for (int64_t i = 0; i < n; ++i) EXPECT_EQ(dx[size_t(i)] == 0.0f, y[size_t(i)] == 0.0f);
  dropout_apply(x.data(), dx.data(), n, p, dropout_key(5, 4, 1, dropout_salt("site")), DropoutLayout{}, false);
  EXPECT_NE(std::memcmp(dx.data(), y.data(), sizeof(float) * size_t(n)), 0);  // another step, another mask
  // A part of the whole tensor (rows 100.. of a data rank, columns 200..299 of a row-parallel
  // slice of a 400-wide x) draws the whole tensor's mask on its elements.
  const int64_t rows = 50, cols = 100, width = 400, row0 = 100, col0 = 200;
  std::vector<float> part(size_t(rows * cols), 1.0f), part_y(part.size());
  dropout_apply(part.data(), part_y.data(), rows * cols, p, key, DropoutLayout{cols, width, col0, row0}, false);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c)
      ASSERT_EQ(part_y[size_t(r * cols + c)], y[size_t((row0 + r) * width + col0 + c)]) << r << ", " << c;

  // In a program: the loss changes with dropout, repeats with the same seed, is the same
  // with recomputation (the recomputed forward draws the same mask), and the naive backend
  // agrees.
  Policy pol = tiny_policy();
  pol.lora.rank = 4;
  pol.lora.targets = {"c_attn", "c_fc"};
  const float without = one_micro_step("gpt2-tiny", pol, fill_adapters)->loss();
  pol.lora.dropout = 0.25;
  const auto with = one_micro_step("gpt2-tiny", pol, fill_adapters);
  EXPECT_NE(with->loss(), without);
  EXPECT_EQ(loss_bytes(*with), loss_bytes(*one_micro_step("gpt2-tiny", pol, fill_adapters)));
  Policy recompute = pol;
  recompute.recompute = parse_recompute("full");
  const auto rec = one_micro_step("gpt2-tiny", recompute, fill_adapters);
  const auto reference = one_micro_step("gpt2-tiny", pol, fill_adapters, true);
  EXPECT_NEAR(reference->loss(), with->loss(), 1e-5 * std::abs(with->loss()));
  expect_gradients_agree(*with, *rec, *reference, 1e-5, 1e-3);
}

// QLoRA computes in bf16 unless told otherwise (bitsandbytes' compute dtype); a given
// precision, from a flag or a config key, stays.
TEST(Lora, AQuantisedBaseDefaultsToBf16Compute) {
  auto header = [](const std::string& args) {
    const test::CliResult r = test::run_memfit("plan --model llama-tiny --lora-rank 4 " + args);
    EXPECT_EQ(r.status, 0) << r.err;
    return r.out.substr(0, r.out.find('\n'));
  };
  EXPECT_NE(header("--quantize-base nf4").find(", bf16,"), std::string::npos);
  EXPECT_NE(header("--quantize-base nf4 --precision fp32").find(", fp32,"), std::string::npos);
  EXPECT_NE(header("").find(", fp32,"), std::string::npos);
}

// A tensor's values widened to fp32, whatever float type it is stored in.
std::vector<float> widened(const Executor& ex, TensorId id) {
  if (ex.program().tensor(id).dtype == DType::f32) return test::tensor_values<float>(ex, id);
  const std::vector<bf16_t> v = test::tensor_values<bf16_t>(ex, id);
  std::vector<float> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = widen(v[i]);
  return out;
}

TEST(Lora, DoraMagnitudesStartAtTheRowNormsAndAStepStaysWithinThePlan) {
  // The last case: QDoRA, an NF4 base with double quantisation in fp32 compute, whose rows the
  // magnitudes' start and the step's norms both dequantise.
  for (const auto& [model, precision, quantised] :
       {std::tuple{"gpt2-tiny", Precision::fp32, false}, std::tuple{"gpt2-tiny", Precision::bf16, false},
        std::tuple{"llama-tiny", Precision::fp32, false}, std::tuple{"llama-tiny", Precision::bf16, false},
        std::tuple{"llama-tiny", Precision::fp32, true}}) {
      SCOPED_TRACE(std::string(model) + " " + std::string(precision_name(precision)) + (quantised ? " nf4" : ""));
      Policy pol = tiny_policy();
      pol.grad_accum = 1;
      pol.precision = precision;
      pol.lora.rank = 4;
      pol.lora.targets = {"all-linear"};
      if (quantised) {
        pol.quantize_base = BaseQuantPolicy{BaseQuant::nf4, 64, true};
        pol.attention = AttentionKind::flash;
      }
      if (precision == Precision::bf16) {
        pol.recompute = parse_recompute("full");
        pol.attention = AttentionKind::flash;
      }
      auto compile = [&](const Policy& p) {
        return compile_program(build_training_program(model_preset(model), p, {}, cpu_capabilities()),
                               *make_cpu_backend());
      };
      test::TinyRun lora(compile(pol), 7, {}, model);
      pol.lora.dora = true;
      test::TinyRun run(compile(pol), 7, {}, model);
      const Program& p = run.compiled.program;
      int magnitudes = 0;
      for (const LinearModule& m : linear_modules(p)) {
        if (quantised) {  // W has no float copy: the loss below holds m to ||dequantised W||
          ++magnitudes;
          continue;
        }
        const std::vector<float> w = widened(*run.ex, param(p, m.weight).value);
        const std::vector<float> mag = widened(*run.ex, param(p, lora_magnitude_name(m.name)).value);
        ASSERT_EQ(int64_t(mag.size()), m.rows) << m.name;
        for (int64_t r = 0; r < m.rows; ++r) {
          double sum = 0;
          for (int64_t c = 0; c < m.cols; ++c) sum += std::pow(double(w[size_t((m.row_begin + r) * m.cols + c)]), 2);
          const double want = std::sqrt(sum);  // B = 0: ||W + scale B A|| = ||W||
          EXPECT_NEAR(mag[size_t(r)], want, (precision == Precision::fp32 ? 1e-6 : 4e-3) * want) << m.name << " row " << r;
        }
        ++magnitudes;
      }
      EXPECT_EQ(magnitudes, std::count_if(p.params().begin(), p.params().end(), [](const ParamEntry& e) {
                  return e.name.ends_with(".lora_magnitude_vector");
                }));
      EXPECT_GT(magnitudes, 0);
      run.step(1);
      lora.step(1);
      if (precision == Precision::fp32) EXPECT_EQ(run.loss(), lora.loss());  // m / ||W|| is exactly 1
      if (quantised) EXPECT_GT(std::count_if(p.ops().begin(), p.ops().end(), [](const Op& op) {
                                 return op.kind == OpKind::dora_norm && std::get<DoraNormAttrs>(op.attrs).quantized;
                               }), 0);
      const auto before = values(*run.ex);
      test::alloc_counter_start();
      run.step(2);
      EXPECT_EQ(test::alloc_counter_stop().memfit_allocations, 0);
      EXPECT_EQ(run.compiled.plan.tier(Tier::device).peak_bytes, run.ex->arena(Tier::device).measured_high_water());
      const auto after = values(*run.ex);
      for (const ParamEntry& e : p.params())
        if (e.name.ends_with(".lora_magnitude_vector")) EXPECT_NE(after.at(e.name), before.at(e.name)) << e.name;
    }
}

// DoRA with lora_dropout (PEFT's form: the dropped input's own base product, over llama's q,
// k and v as windows of the fused weight; its values are held to PEFT by lora_parity_test):
// the naive backend agrees, recomputation draws the same masks, and a step allocates nothing
// and peaks where planned, on a float and on a quantised (NF4) base.
TEST(Lora, DoraWithDropoutAgreesAcrossBackendsAndRecomputationWithinThePlan) {
  for (const bool quantised : {false, true}) {
    SCOPED_TRACE(quantised ? "nf4" : "fp32");
    Policy pol = tiny_policy();
    pol.lora.rank = 4;
    pol.lora.targets = {"all-linear"};
    pol.lora.dora = true;
    pol.lora.dropout = 0.2;
    if (quantised) pol.quantize_base = BaseQuantPolicy{BaseQuant::nf4, 64, true};
    const auto with = one_micro_step("llama-tiny", pol, fill_adapters);
    Policy plain = pol;
    plain.lora.dropout = 0;
    EXPECT_NE(with->loss(), one_micro_step("llama-tiny", plain, fill_adapters)->loss());
    Policy recompute = pol;
    recompute.recompute = parse_recompute("full");
    const auto rec = one_micro_step("llama-tiny", recompute, fill_adapters);
    const auto reference = one_micro_step("llama-tiny", pol, fill_adapters, true);
    EXPECT_EQ(loss_bytes(*rec), loss_bytes(*with));
    EXPECT_NEAR(reference->loss(), with->loss(), 1e-5 * std::abs(with->loss()));
    int windows = 0;
    for (const Op& op : with->compiled.program.ops())
      windows += op.phase != Phase::forward ? 0
                 : op.kind == OpKind::matmul ? std::get<MatmulAttrs>(op.attrs).b_window
                 : op.kind == OpKind::quant_linear ? std::get<QuantLinearAttrs>(op.attrs).piece >= 0 : 0;
    EXPECT_EQ(windows, 2 * 3);  // q, k and v of each of the two layers
    expect_gradients_agree(*with, *rec, *reference, 0, 1e-4);  // recomputation: bit for bit
    for (const Precision precision : {Precision::fp32, Precision::bf16}) {
      Policy stepped = pol;
      stepped.grad_accum = 2;
      stepped.precision = precision;
      if (precision == Precision::bf16) stepped.attention = AttentionKind::flash;
      test::TinyRun run(compile_program(build_training_program(model_preset("llama-tiny"), stepped, {},
                                                               cpu_capabilities()),
                                        *make_cpu_backend()),
                        7, {}, "llama-tiny");
      const auto [before, after] = two_steps_within_the_plan(run);
      for (const ParamEntry& e : run.compiled.program.params())
        if (e.name.ends_with(".lora_magnitude_vector")) EXPECT_NE(after.at(e.name), before.at(e.name)) << e.name;
    }
  }
}

TEST(Lora, BadInputIsRefusedInOneLine) {
  auto refused = [](const std::vector<std::string>& args, const std::string& needle) {
    std::string line;
    for (const std::string& a : args) line += (line.empty() ? "" : " ") + a;
    const test::CliResult r = test::run_memfit(line);
    EXPECT_NE(r.status, 0) << needle;
    EXPECT_NE(r.err.find(needle), std::string::npos) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  };
  refused({"train", "--lora-rank", "0"}, "--lora-rank must be an integer in [1,");
  refused({"train", "--lora-rank", "129", "--lora-targets", "c_attn"}, "LoRA rank 129 is larger than min(in, out)");
  refused({"train", "--lora-rank", "4", "--lora-targets", "q_proj"},
          "LoRA target 'q_proj' matches no linear layer of this model (its linear layers: c_attn, c_fc, c_proj)");
  refused({"train", "--model", "llama-tiny", "--lora-rank", "4", "--lora-targets", "c_attn"},
          "(its linear layers: down_proj, gate_proj, k_proj, o_proj, q_proj, up_proj, v_proj)");
  refused({"train", "--lora-rank", "4", "--lora-dropout", "1"}, "--lora-dropout must be");
  refused({"train", "--lora-rank", "4", "--lora-bias", "some"}, "unknown LoRA bias 'some'");
  refused({"train", "--quantize-base", "nf4"}, "add LoRA (--lora-rank) or --freeze");
  refused({"train", "--lora-rank", "4", "--double-quant"}, "--double-quant quantises the absmax of a 4-bit base: add "
                                                           "--quantize-base nf4 or fp4");
  refused({"plan", "--lora-rank", "4", "--double-quant"}, "add --quantize-base nf4 or fp4");
  refused({"train", "--lora-rank", "4", "--quantize-base", "int8", "--double-quant"},
          "--double-quant quantises the absmax of a 4-bit base: use --quantize-base nf4 or fp4, not int8");
  refused({"plan", "--world-size", "2", "--tensor-parallel", "2", "--lora-rank", "4", "--quantize-base", "nf4"},
          "a quantised base with tensor parallelism is not supported");
  refused({"train", "--lora-rank", "4", "--quantize-base", "nf4", "--quant-block", "48"},
          "block size 48 is not one bitsandbytes supports");
  // PEFT LoraConfig keys that change the adapters' arithmetic, the modules they wrap or the base:
  // refused, never read as plain LoRA. A config file (key "lora") and --load-adapter share them.
  const std::string dir = test::temp_dir() + "/lora_config_keys";
  std::filesystem::create_directories(dir);
  auto with_lora = [&](const std::string& name, const std::string& extra) {
    const std::string path = dir + "/" + name + ".json";
    std::ofstream(path) << R"({"model": "llama-tiny", "steps": 1, "lora": {"r": 4, )" << extra << "}}";
    return path;
  };
  refused({"train", "--config", with_lora("dora", R"("use_dora": 1)")}, "lora.use_dora");
  refused({"plan", "--world-size", "2", "--tensor-parallel", "2", "--lora-rank", "4", "--lora-dora"},
          "DoRA (use_dora) with tensor parallelism: not supported");
  refused({"train", "--config", with_lora("rslora", R"("use_rslora": "yes")")}, "lora.use_rslora");
  // modules_to_save matches as PEFT does (a module path ending with the name); what memfit
  // cannot train whole beside the adapters is refused, naming why.
  refused({"train", "--model", "llama-tiny", "--lora-rank", "4", "--lora-modules-to-save", "foo"},
          "modules_to_save 'foo' matches no module of this model (its modules: down_proj, embed_tokens, gate_proj, "
          "input_layernorm, lm_head, norm, o_proj, post_attention_layernorm, up_proj)");
  refused({"train", "--model", "llama-tiny", "--lora-rank", "4", "--lora-modules-to-save", "mlp"},
          "modules_to_save 'mlp' names a module that holds other modules");
  // As PEFT, an adapter never wraps a module trained whole: o_proj leaves the targets.
  refused({"train", "--model", "llama-tiny", "--lora-rank", "4", "--lora-targets", "o_proj",
           "--lora-modules-to-save", "o_proj"}, "leave no target");
  refused({"train", "--model", "llama-tiny", "--lora-rank", "4", "--lora-modules-to-save", "k_proj"},
          "which memfit holds fused with the other q/k/v projections");
  refused({"train", "--lora-rank", "4", "--lora-modules-to-save", "wte"}, "tied to the output head here");
  refused({"train", "--lora-rank", "4", "--lora-modules-to-save", "c_fc"}, "a GPT-2 Conv1D layer: not supported");
  refused({"train", "--config", with_lora("mts", R"("modules_to_save": "lm_head")")}, "lora.modules_to_save");
  refused({"train", "--config", with_lora("lora_bias", R"("lora_bias": true)")}, "lora.lora_bias: true is not supported");
  refused({"train", "--config", with_lora("replication", R"("layer_replication": [[0, 1]])")},
          "lora.layer_replication is not supported");
  refused({"train", "--config", with_lora("rank_pattern", R"("rank_pattern": {"q_proj": 8, "layers.0.self_attn.q_proj": 2})")},
          "LoRA rank_pattern keys 'layers.0.self_attn.q_proj' and 'q_proj' both match module model.layers.0.self_attn.q_proj");
  refused({"train", "--config", with_lora("rank_big", R"("rank_pattern": {"q_proj": 100})")},
          "LoRA rank 100 is larger than min(in, out) = min(64, 64) of layers.0.self_attn.q_proj");
  refused({"train", "--config", with_lora("layers_regex", R"("target_modules": ".*q_proj", "layers_to_transform": 1)")},
          "LoRA layers_to_transform needs target_modules as a list of names");
  refused({"train", "--model", "llama-tiny", "--lora-rank", "4", "--lora-targets", "q_proj", "--lora-layers", "7"},
          "LoRA: exclude_modules, modules_to_save and layers_to_transform leave no target");
  refused({"train", "--model", "llama-tiny", "--lora-rank", "4", "--lora-layers", "one"}, "--lora-layers");
  refused({"train", "--config", with_lora("exclude_regex", R"("exclude_modules": "(")")},
          "LoRA exclude_modules '(' is not a valid regular expression");
  refused({"train", "--model", "llama-tiny", "--lora-rank", "4", "--lora-modules-to-save", "'norm('"},
          "LoRA modules_to_save 'norm(' is not a valid regular expression");
  refused({"train", "--config", with_lora("corda", R"("init_lora_weights": "corda")")},
          "lora.init_lora_weights 'corda' is not supported: memfit builds true");
  refused({"train", "--config", with_lora("orthogonal", R"("init_lora_weights": "orthogonal")")},
          "lora.init_lora_weights orthogonal is not supported: memfit draws PEFT's true, \"gaussian\" or false");
  refused({"train", "--lora-rank", "4", "--lora-init", "zeros"}, "--lora-init 'zeros': expected true, gaussian, false, olora, pissa");
  const test::CliResult plain = test::run_memfit("train --steps 1 --config " + with_lora("default", R"("init_lora_weights": true)"));
  EXPECT_EQ(plain.status, 0) << plain.err;
  // transformers' BitsAndBytesConfig names the compute dtype as torch does; fp16 is QLoRA's on
  // GPUs without bf16.
  auto quantised = [&](const std::string& name, const std::string& dtype) {
    const std::string path = dir + "/" + name + ".json";
    std::ofstream(path) << R"({"model": "llama-tiny", "lora": {"r": 4}, "quantization_config": {"load_in_4bit": true, )"
                        << R"("bnb_4bit_quant_type": "nf4", "bnb_4bit_compute_dtype": ")" << dtype << R"("}})";
    return path;
  };
  const test::CliResult fp16 = test::run_memfit("plan --config " + quantised("fp16", "float16"));
  EXPECT_EQ(fp16.status, 0) << fp16.err;
  EXPECT_NE(fp16.out.find(", fp16, "), std::string::npos) << fp16.out;
  refused({"plan", "--config", quantised("fp8", "float8_e4m3fn")},
          "quantization_config.bnb_4bit_compute_dtype 'float8_e4m3fn' is not bfloat16, float16 or float32");
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace memfit
