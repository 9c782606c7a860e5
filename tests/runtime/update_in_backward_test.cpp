// The optimizer in backward (graph/update_in_backward.hpp) changes when parameters are
// updated, not what they become:
// - after three training steps every parameter (and master weight) is bitwise equal to the
//   run with the grouped update in the optimizer section, for fp32 and bf16, AdamW and 8-bit
//   AdamW, with and without recomputation;
// - each update op comes after the last op that uses its parameter or gradient, and the
//   optimizer section is left empty;
// - steps allocate nothing and the measured high-water mark equals the plan;
// - with full recomputation the planned peak falls (the gradients no longer pile up at the
//   end of the backward); refused combinations name the reason.
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "graph/training_program.hpp"
#include "graph/update_in_backward.hpp"
#include "runtime/executor.hpp"
#include "support/alloc_counter.hpp"
#include "support/tiny_run.hpp"
#include "kernels/backend.hpp"
#include "support/tensor_values.hpp"

namespace memfit {
namespace {

struct Trained {
  std::vector<std::vector<char>> state;  // parameter values and masters, in params() order
  uint64_t planned = 0, measured = 0;
  int64_t allocations = -1;
  float loss = 0;
};

Trained train(Policy pol) {
  pol.with_eval = false;
  test::TinyRun run(pol);
  Trained t;
  run.step(1);
  test::alloc_counter_start();
  for (int64_t step = 2; step <= 3; ++step) run.step(step);
  t.allocations = test::alloc_counter_stop().memfit_allocations;
  const Program& p = run.compiled.program;
  for (const ParamEntry& e : p.params())
    for (TensorId id : {e.value, e.master}) {
      if (id == kNoTensor) continue;
      const std::vector<std::byte> bytes = test::tensor_bytes(*run.ex, id);
      const char* d = reinterpret_cast<const char*>(bytes.data());
      t.state.emplace_back(d, d + bytes.size());
    }
  t.planned = run.compiled.plan.tier(Tier::device).peak_bytes;
  t.measured = run.ex->arena(Tier::device).measured_high_water();
  t.loss = run.loss();
  return t;
}

Policy tiny_policy(Precision precision, OptimizerKind optimizer, const std::string& recompute) {
  Policy pol;
  pol.batch = 2;
  pol.seq = 64;
  pol.precision = precision;
  pol.optimizer = optimizer;
  pol.recompute = parse_recompute(recompute);
  return pol;
}

TEST(UpdateInBackward, BitwiseEqualToTheGroupedUpdate) {
  struct Case {
    Precision precision;
    OptimizerKind optimizer;
    std::string recompute;
  };
  for (const Case& k : {Case{Precision::fp32, OptimizerKind::adamw, "none"},
                        Case{Precision::bf16, OptimizerKind::adamw, "full"},
                        Case{Precision::fp32, OptimizerKind::adamw8bit, "selective"},
                        Case{Precision::bf16, OptimizerKind::adamw8bit, "every:2"}}) {
    const std::string what = std::string(precision_name(k.precision)) + " " +
                             std::string(optimizer_name(k.optimizer)) + " recompute " + k.recompute;
    Policy pol = tiny_policy(k.precision, k.optimizer, k.recompute);
    const Trained grouped = train(pol);
    pol.update_in_backward = true;
    const Trained fused = train(pol);
    ASSERT_EQ(grouped.state.size(), fused.state.size());
    for (size_t i = 0; i < grouped.state.size(); ++i)
      EXPECT_TRUE(grouped.state[i] == fused.state[i]) << what << ": parameter tensor " << i << " differs";
    EXPECT_EQ(std::memcmp(&grouped.loss, &fused.loss, sizeof(float)), 0) << what;
    EXPECT_EQ(fused.measured, fused.planned) << what;
    EXPECT_EQ(fused.allocations, 0) << what;
    EXPECT_LE(fused.planned, grouped.planned) << what;
    std::printf("%-34s planned peak %9lu B grouped, %9lu B in backward\n", what.c_str(),
                (unsigned long)grouped.planned, (unsigned long)fused.planned);
  }
}

TEST(UpdateInBackward, UpdatesFollowTheLastUseAndThePeakFalls) {
  Policy pol = tiny_policy(Precision::bf16, OptimizerKind::adamw, "full");
  pol.batch = 1;  // small activations: the gradients decide the peak
  const Program grouped = build_training_program(model_preset("gpt2-tiny"), pol, {}, cpu_capabilities());
  pol.update_in_backward = true;
  const Program p = build_training_program(model_preset("gpt2-tiny"), pol, {}, cpu_capabilities());
  const Section* opt = p.find_section(SectionKind::optimizer);
  ASSERT_NE(opt, nullptr);
  EXPECT_EQ(opt->begin, opt->end);
  const Section* micro = p.find_section(SectionKind::micro);
  std::map<TensorId, int> last_use;
  int updates = 0;
  for (int i = micro->begin; i < micro->end; ++i) {
    const Op& op = p.op(i);
    if (op.kind == OpKind::adamw) {
      ++updates;
      ASSERT_EQ(op.inputs.size(), 1u);
      const ParamEntry* e = nullptr;
      for (const ParamEntry& q : p.params())
        if (q.grad == op.inputs[0]) e = &q;
      ASSERT_NE(e, nullptr) << op.name;
      for (int j = i + 1; j < micro->end; ++j) {
        const Op& later = p.op(j);
        if (later.kind == OpKind::cast && later.outputs[0] == e->value) continue;  // its own narrowing
        for (const auto* list : {&later.inputs, &later.outputs})
          for (TensorId id : *list)
            EXPECT_TRUE(id != e->value && id != e->grad && id != e->master)
                << "op '" << later.name << "' uses " << e->name << " after its update '" << op.name << "'";
      }
    }
  }
  int trainable = 0;
  for (const ParamEntry& e : p.params()) trainable += e.trainable ? 1 : 0;
  EXPECT_EQ(updates, trainable);

  auto backend = make_cpu_backend();
  const uint64_t before = compile_program(grouped, *backend).plan.tier(Tier::device).peak_bytes;
  const uint64_t after = compile_program(p, *backend).plan.tier(Tier::device).peak_bytes;
  EXPECT_LT(after, before);
  std::printf("bf16, recompute full, batch 1: planned peak %lu B grouped, %lu B in backward\n", (unsigned long)before,
              (unsigned long)after);
}

TEST(UpdateInBackward, RefusesWhatNeedsEveryGradientFirst) {
  const ModelSpec spec = model_preset("gpt2-tiny");
  auto refused = [&](Policy pol, const std::string& expect) {
    pol.update_in_backward = true;
    try {
      (void)build_training_program(spec, pol, {}, cpu_capabilities());
      ADD_FAILURE() << "accepted; expected an error about " << expect;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(expect), std::string::npos) << e.what();
    }
  };
  Policy pol;
  pol.grad_accum = 2;
  refused(pol, "one micro-step");
  pol = Policy{};
  pol.grad_clip = 1.0;
  refused(pol, "clipping");
  pol = Policy{};
  pol.precision = Precision::fp16;
  refused(pol, "fp16");
}

}  // namespace
}  // namespace memfit
