// memfit against PyTorch + HF transformers on the committed fixture (tools/make_gpt2_fixtures.py):
// a 2-layer GPT-2 with a 250-token vocabulary (padded to 256 rows by memfit), one batch of
// 2 x 32. Per-token losses and the mean loss to 1e-5 relative, every parameter gradient to
// 1e-4 (max |a - b| / max |b|), and the loss trajectory over three AdamW steps to 1e-4
// (support/torch_fixture.hpp).
#include <gtest/gtest.h>

#include "support/torch_fixture.hpp"

namespace memfit {
namespace {

TEST(PyTorchParity, LossesAndEveryGradientMatch) {
  test::TorchFixtureRun run("gpt2_tiny_torch");
  ASSERT_EQ(run.spec.arch, Arch::gpt2);
  test::expect_loss_and_gradients_match(run);
}

TEST(PyTorchParity, ThreeAdamWStepsFollowTheSameLosses) {
  test::TorchFixtureRun run("gpt2_tiny_torch");
  test::expect_adamw_losses_match(run);
}

}  // namespace
}  // namespace memfit
