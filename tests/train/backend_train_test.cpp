// End to end on the second backend: gpt2-tiny and llama-tiny trained a few steps with
// `backend = reference` (the naive kernels, kernels/reference/reference_backend.cpp) follow the
// CPU backend's training and validation losses within kLossTol, and the reference run's
// measured device high-water mark equals its plan byte for byte. Both backends build the
// program for their own capabilities and plan their own scratch (the reference has none), so
// the plans differ by the CPU's library scratch only.
#include <gtest/gtest.h>

#include <cmath>
#include <sstream>

#include "core/error.hpp"
#include "train/trainer.hpp"

namespace memfit {
namespace {

// Relative difference allowed between the two backends' losses after 4 AdamW steps (fp32
// kernels against double accumulation; measured at most 5e-8 relative).
constexpr double kLossTol = 1e-5;

struct TrainResult {
  std::vector<double> losses;  // training losses then validation losses
  uint64_t planned = 0, measured = 0;
};

TrainResult train(RunConfig c, const std::string& backend) {
  c.backend = backend;
  std::ostringstream log;
  const nlohmann::json report = run_training(c, log);
  TrainResult r;
  for (const auto& l : report["loss"]["history"]) r.losses.push_back(l.get<double>());
  for (const auto& v : report["validation"]["history"]) r.losses.push_back(v["loss"].get<double>());
  r.planned = report["memory"]["planned_peak_bytes"]["device"].get<uint64_t>();
  r.measured = report["memory"]["measured_peak_bytes"]["device"].get<uint64_t>();
  return r;
}

void expect_reference_follows_cpu(RunConfig c) {
  c.policy.batch = 2;
  c.policy.seq = 32;
  c.steps = 4;
  c.lr = 2e-3;
  c.eval_every = 2;
  c.eval_batches = 2;
  c.log_every = 0;
  const TrainResult cpu = train(c, "cpu"), ref = train(c, "reference");
  ASSERT_EQ(cpu.losses.size(), ref.losses.size());
  ASSERT_EQ(cpu.losses.size(), 6u);  // 4 steps, 2 validations
  for (size_t i = 0; i < cpu.losses.size(); ++i)
    EXPECT_LE(std::fabs(ref.losses[i] - cpu.losses[i]), kLossTol * std::fabs(cpu.losses[i]))
        << "loss " << i << ": reference " << ref.losses[i] << ", cpu " << cpu.losses[i];
  EXPECT_EQ(ref.planned, ref.measured);
  EXPECT_EQ(cpu.planned, cpu.measured);
  EXPECT_LE(ref.planned, cpu.planned);  // the same program without the CPU's library scratch
}

TEST(BackendTraining, Gpt2TinyOnTheReferenceBackendFollowsTheCpu) {
  RunConfig c;
  c.model = "gpt2-tiny";
  c.policy.grad_accum = 2;  // accumulate_after_first_micro and the clipped update go through both backends
  c.policy.grad_clip = 1.0;
  expect_reference_follows_cpu(c);
}

TEST(BackendTraining, LlamaTinyOnTheReferenceBackendFollowsTheCpu) {
  RunConfig c;
  c.model = "llama-tiny";
  expect_reference_follows_cpu(c);
  c.policy.attention = AttentionKind::flash;  // the naive flash form
  expect_reference_follows_cpu(c);
}

TEST(BackendTraining, TheReferenceBackendRefusesA16BitRunNamingTheOp) {
  RunConfig c;
  c.model = "gpt2-tiny";
  c.policy.batch = 1;
  c.policy.seq = 16;
  c.steps = 1;
  c.log_every = 0;
  c.policy.precision = Precision::bf16;
  c.backend = "reference";
  std::ostringstream log;
  try {
    run_training(c, log);
    ADD_FAILURE() << "a bf16 run started on the reference backend";
  } catch (const Error& e) {
    EXPECT_EQ(e.piece(), "kernels");
    EXPECT_NE(std::string(e.what()).find("no reference kernel for"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace memfit
