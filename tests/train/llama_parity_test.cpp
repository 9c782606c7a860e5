// memfit's llama against PyTorch + HF transformers on the committed fixture
// (tools/make_llama_fixtures.py): a 2-layer LlamaForCausalLM with grouped-query attention (4
// query heads, 2 key/value heads), RMSNorm, rotary embeddings, SwiGLU, an untied lm_head and a
// 250-token vocabulary (padded to 256 rows by memfit), on one batch of 2 x 32, with the GPT-2
// parity test's tolerances (support/torch_fixture.hpp), in plain and flash attention. The
// weights go through the HF llama loader (q|k|v fused on load).
#include <gtest/gtest.h>

#include "support/torch_fixture.hpp"

namespace memfit {
namespace {

class LlamaParity : public ::testing::TestWithParam<AttentionKind> {};

TEST_P(LlamaParity, LossesAndEveryGradientMatch) {
  test::TorchFixtureRun run("llama_tiny_torch", GetParam());
  ASSERT_EQ(run.spec.arch, Arch::llama);
  ASSERT_LT(run.spec.n_kv_head, run.spec.n_head);  // the fixture exercises grouped-query attention
  ASSERT_FALSE(run.spec.tied_embeddings);
  test::expect_loss_and_gradients_match(run);
}

TEST_P(LlamaParity, ThreeAdamWStepsFollowTheSameLosses) {
  test::TorchFixtureRun run("llama_tiny_torch", GetParam());
  test::expect_adamw_losses_match(run);
}

INSTANTIATE_TEST_SUITE_P(Attention, LlamaParity, ::testing::Values(AttentionKind::naive, AttentionKind::flash),
                         [](const auto& info) { return info.param == AttentionKind::flash ? "flash" : "plain"; });

}  // namespace
}  // namespace memfit
