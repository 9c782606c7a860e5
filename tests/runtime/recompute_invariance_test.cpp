// Recomputation and flash attention change where bytes live, not what is computed:
// - every recompute policy gives the loss and every parameter gradient bitwise equal to the
//   policy `none` (same kernels, same inputs, same order of accumulation), with the plain and
//   with the flash attention core, with and without gradient accumulation;
// - flash attention gives the loss and gradients of the plain form within 1e-5 (relative to
//   each gradient's largest element);
// - each of these programs keeps the executor's promises: no allocation in a step, and the
//   arena's measured high-water mark equal to the plan, byte for byte.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "graph/recompute.hpp"
#include "graph/training_program.hpp"
#include "runtime/executor.hpp"
#include "support/alloc_counter.hpp"
#include "train/init.hpp"
#include "kernels/backend.hpp"
#include "support/tensor_values.hpp"

namespace memfit {
namespace {

struct Result {
  std::vector<std::vector<float>> grads;  // in params() order
  float loss = 0;
  uint64_t planned = 0, measured = 0;
  int64_t allocations = -1;
  double recompute_flops = 0;
};

// One optimizer step's micro-steps (no update) on fixed tokens; gradients read afterwards.
Result run_micro(const std::string& recompute, AttentionKind attention, int accumulation, bool count_allocations,
                 Precision precision = Precision::fp32) {
  const ModelSpec spec = model_preset("gpt2-tiny");
  Policy pol;
  pol.batch = 2;
  pol.seq = 96;  // not a multiple of flash attention's 64-row tiles
  pol.grad_accum = accumulation;
  pol.recompute = parse_recompute(recompute);
  pol.attention = attention;
  pol.precision = precision;  // gradients stay fp32 (the default gradient dtype)
  auto backend = make_cpu_backend();
  const CompiledProgram c = compile_program(build_training_program(spec, pol, {}, cpu_capabilities()), *backend);
  Executor ex(c, *backend);
  initialize_parameters(ex, spec, 11);
  zero_persistent_state(ex);
  const Program& p = c.program;
  const TensorId tokens = p.find_tensor(kTokens), targets = p.find_tensor(kTargets);
  std::vector<int32_t> x(size_t(p.tensor(tokens).numel())), y(x.size());  // sized once: the handler allocates nothing
  ex.set_input_handler([&](const Op&, const StepContext& ctx) {
    for (int64_t i = 0; i < int64_t(x.size()); ++i) {
      x[size_t(i)] = int32_t((i * 31 + ctx.micro * 7 + 3) % 256);
      y[size_t(i)] = int32_t((i * 31 + ctx.micro * 7 + 34) % 256);
    }
    ex.write_as<int32_t>(tokens, std::span<const int32_t>(x));
    ex.write_as<int32_t>(targets, std::span<const int32_t>(y));
  });
  StepContext ctx;
  ctx.micro_count = accumulation;
  auto micro_steps = [&] {
    for (ctx.micro = 0; ctx.micro < accumulation; ++ctx.micro) ex.run_section(SectionKind::micro, ctx);
  };
  micro_steps();  // warm-up (OpenMP team, oneDNN JIT), then the measured repetition
  if (count_allocations) test::alloc_counter_start();
  micro_steps();
  Result r;
  if (count_allocations) r.allocations = test::alloc_counter_stop().memfit_allocations;
  for (const ParamEntry& e : p.params()) r.grads.push_back(test::tensor_values<float>(ex, e.grad));
  r.loss = ex.read_scalar<float>(p.find_tensor(kLoss));
  r.planned = c.plan.tier(Tier::device).peak_bytes;
  r.measured = ex.buffer(Tier::device).measured_high_water();
  r.recompute_flops = recompute_flops(p);
  return r;
}

void expect_bitwise_equal(const Result& a, const Result& b, const std::string& what) {
  ASSERT_EQ(a.grads.size(), b.grads.size());
  EXPECT_EQ(std::memcmp(&a.loss, &b.loss, sizeof(float)), 0) << what << ": loss " << a.loss << " vs " << b.loss;
  for (size_t i = 0; i < a.grads.size(); ++i) {
    ASSERT_EQ(a.grads[i].size(), b.grads[i].size());
    EXPECT_EQ(std::memcmp(a.grads[i].data(), b.grads[i].data(), a.grads[i].size() * sizeof(float)), 0)
        << what << ": gradient " << i << " differs";
  }
}

const std::vector<std::string> kPolicies = {"full", "every:2", "every:3", "every:sqrt", "selective",
                                            "selective:mlp_activation,norms", "selective:attention,gelu,norms"};

TEST(RecomputeInvariance, EveryPolicyGivesBitwiseEqualGradients) {
  for (AttentionKind attention : {AttentionKind::plain, AttentionKind::flash}) {
    const Result base = run_micro("none", attention, 1, false);
    EXPECT_EQ(base.recompute_flops, 0.0);
    for (const std::string& policy : kPolicies) {
      const Result r = run_micro(policy, attention, 1, false);
      const std::string what = policy + " / " + std::string(attention_name(attention));
      expect_bitwise_equal(r, base, what);
      EXPECT_EQ(r.measured, r.planned) << what;
      // Only flash + selective:attention recomputes nothing: flash keeps no probabilities.
      if (attention == AttentionKind::flash && policy == "selective") {
        EXPECT_EQ(r.recompute_flops, 0.0) << what;
        EXPECT_EQ(r.planned, base.planned) << what;
      } else {
        EXPECT_GT(r.recompute_flops, 0.0) << what;
        EXPECT_LT(r.planned, base.planned) << what;
      }
      std::printf("%-36s %-6s planned %10lu B (none %lu), recompute %.3g GFLOP\n", policy.c_str(),
                  std::string(attention_name(attention)).c_str(), (unsigned long)r.planned,
                  (unsigned long)base.planned, r.recompute_flops / 1e9);
    }
  }
}

TEST(RecomputeInvariance, SameUnderGradientAccumulation) {
  const Result base = run_micro("none", AttentionKind::plain, 2, false);
  for (const std::string policy : {"full", "every:2", "selective"})
    expect_bitwise_equal(run_micro(policy, AttentionKind::plain, 2, false), base, policy + " with accumulation 2");
}

TEST(RecomputeInvariance, StepsAllocateNothingAndMatchThePlan) {
  for (const std::string policy : {"full", "every:2"})
    for (AttentionKind attention : {AttentionKind::plain, AttentionKind::flash}) {
      const Result r = run_micro(policy, attention, 1, true);
      EXPECT_EQ(r.allocations, 0) << policy;
      EXPECT_EQ(r.measured, r.planned) << policy;
    }
}

// Under mixed precision the recomputed ops get the same dtypes and fp32 islands as the forward
// ops they replay, so the promise is the same: bitwise equal to `none` in that precision.
TEST(RecomputeInvariance, SameUnderBf16AndFp16) {
  for (Precision precision : {Precision::bf16, Precision::fp16})
    for (AttentionKind attention : {AttentionKind::plain, AttentionKind::flash}) {
      const Result base = run_micro("none", attention, 1, false, precision);
      for (const std::string policy : {"full", "every:2", "selective"}) {
        const std::string what =
            policy + " / " + std::string(attention_name(attention)) + " / " + std::string(precision_name(precision));
        const Result r = run_micro(policy, attention, 1, policy == "full", precision);
        expect_bitwise_equal(r, base, what);
        EXPECT_EQ(r.measured, r.planned) << what;
        if (policy == "full") { EXPECT_EQ(r.allocations, 0) << what; }
      }
    }
}

// Flash attention in 16 bits: tiles in fp32, q, k, v, y, dy and dqkv rounded to 16 bits, where
// the plain form rounds the probabilities too. Both are a few 16-bit roundings away from the
// fp32 result; the bound is the fp32-vs-16-bit difference itself, so flash is no worse.
TEST(FlashAttentionProgram, In16BitsAsCloseToFp32AsThePlainForm) {
  const Result exact = run_micro("none", AttentionKind::plain, 1, false);
  for (Precision precision : {Precision::bf16, Precision::fp16}) {
    const Result plain = run_micro("none", AttentionKind::plain, 1, false, precision);
    const Result flash = run_micro("none", AttentionKind::flash, 1, false, precision);
    double plain_err = 0, flash_err = 0;
    for (size_t i = 0; i < exact.grads.size(); ++i) {
      double scale = 0, dp = 0, df = 0;
      for (size_t j = 0; j < exact.grads[i].size(); ++j) {
        scale = std::max(scale, double(std::fabs(exact.grads[i][j])));
        dp = std::max(dp, double(std::fabs(plain.grads[i][j] - exact.grads[i][j])));
        df = std::max(df, double(std::fabs(flash.grads[i][j] - exact.grads[i][j])));
      }
      plain_err = std::max(plain_err, dp / scale);
      flash_err = std::max(flash_err, df / scale);
    }
    const double loss_plain = std::fabs(plain.loss - exact.loss), loss_flash = std::fabs(flash.loss - exact.loss);
    std::printf("%s: loss error plain %.3g flash %.3g; worst normalised gradient error plain %.3g flash %.3g\n",
                std::string(precision_name(precision)).c_str(), loss_plain, loss_flash, plain_err, flash_err);
    EXPECT_LE(flash_err, 1.5 * plain_err + 1e-3) << precision_name(precision);
    EXPECT_LE(loss_flash, 1.5 * loss_plain + 1e-3 * std::fabs(exact.loss)) << precision_name(precision);
    EXPECT_LT(flash.planned, plain.planned);
  }
}

TEST(FlashAttentionProgram, LossAndGradientsWithinOneMillionthOfThePlainForm) {
  const Result plain = run_micro("none", AttentionKind::plain, 1, false);
  const Result flash = run_micro("none", AttentionKind::flash, 1, false);
  EXPECT_NEAR(flash.loss, plain.loss, 1e-5 * std::fabs(plain.loss));
  double worst = 0;
  for (size_t i = 0; i < plain.grads.size(); ++i) {
    double diff = 0, scale = 0;
    for (size_t j = 0; j < plain.grads[i].size(); ++j) {
      diff = std::max(diff, double(std::fabs(flash.grads[i][j] - plain.grads[i][j])));
      scale = std::max(scale, double(std::fabs(plain.grads[i][j])));
    }
    EXPECT_LE(diff, 1e-5 * scale) << "gradient " << i;
    worst = std::max(worst, diff / scale);
  }
  EXPECT_LT(flash.planned, plain.planned);
  std::printf("flash vs plain: loss %.8f vs %.8f, worst normalised gradient difference %.2g\n", flash.loss, plain.loss,
              worst);
}

}  // namespace
}  // namespace memfit
