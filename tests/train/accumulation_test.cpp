// Gradient accumulation end to end: K micro-batches of b rows give the same loss, the same
// gradients, the same clipping norm and the same update as one batch of K*b rows holding the
// same rows, through two optimizer steps (gpt2-tiny, AdamW with clipping).
//
// Tolerances come from fp32 reassociation alone: the two programs add the same per-token
// terms in different groupings (K partial sums of b*T rows against one sum of K*b*T), which
// moves each sum by a few ulps of its largest partial: 1e-6 relative on the loss and 1e-5 of
// each gradient's largest element. The AdamW update divides by sqrt(v) + eps, which magnifies
// a gradient difference dg by at most lr / eps; eps = 1e-6 here (instead of 1e-8) bounds the
// parameter difference by 1e-3 * 1e-9 / 1e-6 = 1e-6 per step for gradient differences of
// 1e-9, so the parameters must agree to 1e-5.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>

#include "graph/optimizer.hpp"
#include "graph/training_program.hpp"
#include "runtime/executor.hpp"
#include "train/init.hpp"
#include "kernels/backend.hpp"
#include "support/tensor_values.hpp"

namespace memfit {
namespace {

constexpr int64_t kRows = 2, kSeq = 32, kMicro = 3;

struct TinyTraining {
  std::unique_ptr<Backend> backend = make_cpu_backend();
  CompiledProgram compiled;
  std::unique_ptr<Executor> ex;
  std::vector<int32_t> tokens, targets;  // all K*b rows

  TinyTraining(int64_t batch, int accum) {
    Policy pol;
    pol.batch = batch;
    pol.seq = kSeq;
    pol.grad_accum = accum;
    pol.grad_clip = 0.5;
    pol.adamw.eps = 1e-6;
    pol.with_eval = false;
    const ModelSpec spec = model_preset("gpt2-tiny");
    compiled = compile_program(build_training_program(spec, pol, {}, cpu_capabilities()), *backend);
    ex = std::make_unique<Executor>(compiled, *backend);
    initialize_parameters(*ex, spec, 7);
    zero_persistent_state(*ex);
    const size_t n = size_t(kRows * kMicro * kSeq);
    for (size_t i = 0; i < n; ++i) {
      tokens.push_back(int32_t((i * 37 + i / 5) % 256));
      targets.push_back(int32_t((i * 37 + 37 + i / 7) % 256));
    }
    const TensorId tok = compiled.program.find_tensor(kTokens), tgt = compiled.program.find_tensor(kTargets);
    // Micro-step m of a batch-b program reads rows [m b, (m + 1) b) of the K*b rows.
    ex->set_input_handler([this, tok, tgt, batch](const Op&, const StepContext& ctx) {
      const size_t count = size_t(batch * kSeq), first = size_t(ctx.micro) * count;
      ex->write_as<int32_t>(tok, std::span<const int32_t>(tokens).subspan(first, count));
      ex->write_as<int32_t>(tgt, std::span<const int32_t>(targets).subspan(first, count));
    });
  }
  const Program& program() const { return compiled.program; }
  float scalar(const char* name) const { return ex->read_scalar<float>(program().find_tensor(name)); }
  std::vector<float> values(TensorId id) const { return test::tensor_values<float>(*ex, id); }
};

double normalized_error(const std::vector<float>& a, const std::vector<float>& b) {
  double diff = 0, scale = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, std::fabs(double(a[i]) - double(b[i])));
    scale = std::max(scale, std::fabs(double(b[i])));
  }
  return scale > 0 ? diff / scale : diff;
}

double max_abs_difference(const std::vector<float>& a, const std::vector<float>& b) {
  double diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff = std::max(diff, std::fabs(double(a[i]) - double(b[i])));
  return diff;
}

TEST(GradientAccumulation, KMicroBatchesEqualOneBatchOfAllRows) {
  TinyTraining big(kRows * kMicro, 1), acc(kRows, int(kMicro));
  ASSERT_EQ(acc.program().find_section(SectionKind::micro)->repeat, kMicro);
  StepContext ctx;
  ctx.lr = 1e-3;

  // The micro-steps alone: loss and accumulated gradients.
  ctx.micro_count = 1;
  big.ex->run_section(SectionKind::micro, ctx);
  ctx.micro_count = int(kMicro);
  for (int m = 0; m < kMicro; ++m) {
    ctx.micro = m;
    acc.ex->run_section(SectionKind::micro, ctx);
  }
  EXPECT_NEAR(acc.scalar(kLoss), big.scalar(kLoss), 1e-6 * big.scalar(kLoss));
  std::printf("loss: one batch %.7f, %ld micro-batches %.7f\n", big.scalar(kLoss), long(kMicro), acc.scalar(kLoss));
  double worst = 0;
  for (size_t i = 0; i < big.program().params().size(); ++i) {
    const ParamEntry& eb = big.program().params()[i];
    const ParamEntry& ea = acc.program().params()[i];
    ASSERT_EQ(eb.name, ea.name);
    const double err = normalized_error(acc.values(ea.grad), big.values(eb.grad));
    EXPECT_LE(err, 1e-5) << eb.name;
    worst = std::max(worst, err);
  }
  std::printf("largest normalised gradient difference: %.3g\n", worst);

  // The optimizer step, then a whole second step through run_step.
  ctx.micro = 0;
  ctx.step = 1;
  big.ex->run_section(SectionKind::optimizer, ctx);
  acc.ex->run_section(SectionKind::optimizer, ctx);
  EXPECT_NEAR(acc.scalar(kGradNorm), big.scalar(kGradNorm), 1e-6 * big.scalar(kGradNorm));
  EXPECT_GT(big.scalar(kGradNorm), 0.5f) << "the test means the clip to be active";
  ctx.step = 2;
  big.ex->run_step(ctx);
  acc.ex->run_step(ctx);
  EXPECT_NEAR(acc.scalar(kLoss), big.scalar(kLoss), 1e-6 * big.scalar(kLoss));
  EXPECT_NEAR(acc.scalar(kGradNorm), big.scalar(kGradNorm), 1e-6 * big.scalar(kGradNorm));
  double worst_param = 0;
  for (size_t i = 0; i < big.program().params().size(); ++i) {
    const double d = max_abs_difference(acc.values(acc.program().params()[i].value),
                                        big.values(big.program().params()[i].value));
    EXPECT_LE(d, 1e-5) << big.program().params()[i].name;
    worst_param = std::max(worst_param, d);
  }
  std::printf("after two steps: largest parameter difference %.3g\n", worst_param);
}

}  // namespace
}  // namespace memfit
