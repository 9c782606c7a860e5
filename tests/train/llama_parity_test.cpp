// memfit's llama family against PyTorch + HF transformers on the committed fixtures
// (tools/make_llama_fixtures.py), with the GPT-2 parity test's tolerances
// (support/torch_fixture.hpp):
// - llama_tiny_torch: a 2-layer LlamaForCausalLM with grouped-query attention (4 query heads,
//   2 key/value heads), RMSNorm, rotary embeddings, SwiGLU and an untied lm_head, in plain and
//   flash attention;
// - qwen2_tiny_torch: a 2-layer Qwen2ForCausalLM, whose q, k and v projections carry biases
//   and whose lm_head is tied to the embedding;
// - llama31_tiny_torch: a Llama with Llama 3.1's llama3 rotary scaling over an original context
//   of 16 positions, trained at 32, so all three frequency bands (kept, blended, divided) occur.
// Both have a 250-token vocabulary (padded to 256 rows by memfit) and one batch of 2 x 32. The
// weights go through the HF loader (q|k|v, and their biases, fused on load).
#include <gtest/gtest.h>

#include <tuple>

#include "support/torch_fixture.hpp"

namespace memfit {
namespace {

class LlamaParity : public ::testing::TestWithParam<std::tuple<const char*, AttentionKind>> {
 protected:
  test::TorchFixtureRun run{std::get<0>(GetParam()), std::get<1>(GetParam())};
};

TEST_P(LlamaParity, LossesAndEveryGradientMatch) {
  ASSERT_EQ(run.spec.arch, Arch::llama);
  ASSERT_LT(run.spec.n_kv_head, run.spec.n_head);  // both fixtures exercise grouped-query attention
  ASSERT_EQ(run.spec.qkv_bias, run.spec.tied_embeddings);  // llama: neither; qwen2: both
  test::expect_loss_and_gradients_match(run);
}

TEST_P(LlamaParity, ThreeAdamWStepsFollowTheSameLosses) { test::expect_adamw_losses_match(run); }

INSTANTIATE_TEST_SUITE_P(Fixtures, LlamaParity,
                         ::testing::Values(std::tuple{"llama_tiny_torch", AttentionKind::plain},
                                           std::tuple{"llama_tiny_torch", AttentionKind::flash},
                                           std::tuple{"qwen2_tiny_torch", AttentionKind::plain},
                                           std::tuple{"llama31_tiny_torch", AttentionKind::plain},
                                           std::tuple{"llama31_tiny_torch", AttentionKind::flash}),
                         [](const auto& info) {
                           const std::string name = std::get<0>(info.param);
                           return name.substr(0, name.find('_')) +
                                  (std::get<1>(info.param) == AttentionKind::flash ? "_flash" : "_plain");
                         });

}  // namespace
}  // namespace memfit
