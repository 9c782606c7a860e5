// `--recompute auto` against an exhaustive search: on small GPT-2 shapes, every assignment of
// every level to every block is built and planned, and for a sweep of budgets (every peak any
// assignment reaches, and the bytes just below each) the search must find a choice exactly
// when one exists, fit the budget, and cost exactly the least recompute FLOPs any fitting
// assignment costs.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include <fmt/format.h>

#include "graph/recompute.hpp"
#include "graph/training_program.hpp"
#include "plan/memory_plan.hpp"
#include "plan/recompute_search.hpp"
#include "kernels/backend.hpp"

namespace memfit {
namespace {

ModelSpec small_gpt2(int64_t layers) {
  ModelSpec s = model_preset("gpt2-tiny");
  s.name = "gpt2-search";
  s.n_layer = layers;
  s.n_embd = 64;
  s.n_inner = 256;
  return s;
}

void expect_search_matches_exhaustive(const ModelSpec& spec, AttentionKind attention, int64_t B, int64_t T) {
  Policy pol;
  pol.batch = B;
  pol.seq = T;
  pol.attention = attention;
  const std::vector<RecomputeCandidate> all = plan_every_assignment(spec, pol, {}, cpu_capabilities());
  std::set<uint64_t> budgets;
  for (const RecomputeCandidate& c : all) budgets.insert({c.peak_bytes, c.peak_bytes - 1});
  int checked = 0, total_planned = 0, max_planned = 0;
  for (uint64_t budget : budgets) {
    const RecomputeChoice best = choose_recompute_exhaustive(all, budget);
    const RecomputeChoice got = choose_recompute(spec, pol, {}, cpu_capabilities(), budget);
    const std::string what = fmt::format("{} layers, {}, budget {}: search {} ({}), exhaustive {} ({})", spec.n_layer,
                                         attention_name(attention), budget, blocks_to_string(got.blocks),
                                         got.peak_bytes, blocks_to_string(best.blocks), best.peak_bytes);
    ASSERT_EQ(got.fits, best.fits) << what;
    ASSERT_EQ(got.blocks.size(), size_t(spec.n_layer)) << what;
    if (!best.fits) continue;
    ++checked;
    total_planned += got.planned;
    max_planned = std::max(max_planned, got.planned);
    EXPECT_LE(got.peak_bytes, budget) << what;
    EXPECT_NEAR(got.recompute_flops, best.recompute_flops, 1e-9 * best.recompute_flops) << what;
    // The choice is what it claims: its program, planned again, has that peak and those FLOPs.
    pol.recompute.mode = RecomputeMode::automatic;
    pol.recompute.blocks = got.blocks;
    const Program p = build_training_program(spec, pol, {}, cpu_capabilities());
    EXPECT_EQ(plan_memory(p).tier(Tier::device).peak_bytes, got.peak_bytes) << what;
    EXPECT_DOUBLE_EQ(recompute_flops(p), got.recompute_flops) << what;
    pol.recompute = {};
  }
  EXPECT_GT(checked, 10);
  std::printf("%ld layers, %s: %zu assignments; %d budgets checked, search planned %.1f programs on average, %d at most\n",
              long(spec.n_layer), std::string(attention_name(attention)).c_str(), all.size(), checked,
              double(total_planned) / checked, max_planned);
}

TEST(RecomputeSearch, MatchesExhaustiveSearchOnThreeBlocks) {
  expect_search_matches_exhaustive(small_gpt2(3), AttentionKind::plain, 4, 64);
}

TEST(RecomputeSearch, MatchesExhaustiveSearchWithFlashAttention) {
  expect_search_matches_exhaustive(small_gpt2(3), AttentionKind::flash, 2, 128);
}

TEST(RecomputeSearch, MatchesExhaustiveSearchOnFourBlocks) {
  expect_search_matches_exhaustive(small_gpt2(4), AttentionKind::plain, 2, 96);
}

TEST(RecomputeSearch, NoRecomputationWhenEverythingFitsAndTheMostWhenNothingDoes) {
  const ModelSpec spec = small_gpt2(3);
  Policy pol;
  pol.batch = 2;
  pol.seq = 64;
  const RecomputeChoice roomy = choose_recompute(spec, pol, {}, cpu_capabilities(), uint64_t(1) << 40);
  EXPECT_TRUE(roomy.fits);
  EXPECT_EQ(roomy.planned, 1);
  EXPECT_EQ(roomy.recompute_flops, 0.0);
  for (const BlockRecompute& b : roomy.blocks) EXPECT_EQ(b, BlockRecompute{});
  const RecomputeChoice tight = choose_recompute(spec, pol, {}, cpu_capabilities(), 1024);
  EXPECT_FALSE(tight.fits);
  for (const BlockRecompute& b : tight.blocks) EXPECT_TRUE(b.whole);
}

}  // namespace
}  // namespace memfit
