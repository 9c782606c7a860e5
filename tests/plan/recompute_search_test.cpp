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

// A large vocabulary's logits chunk against the blocks' activations: for every budget some
// chunk fits, the search (levels and chunk) must give what the exhaustive search over each
// chunk (every assignment planned) gives under the stated rule: a smaller chunk only when it
// fits where the larger does not, or saves more than a tenth of the classifier's FLOPs.
TEST(RecomputeSearch, TakesASmallerClassifierChunkOnlyWhenItSparesEnoughRecomputation) {
  ModelSpec spec = small_gpt2(3);
  spec.n_embd = 256;
  spec.n_inner = 1024;
  spec.vocab_size = spec.padded_vocab = 32000;
  Policy pol;
  pol.batch = 4;
  pol.seq = 256;
  pol.attention = AttentionKind::flash;
  const std::vector<int64_t> smaller = smaller_classifier_chunks(spec, pol);
  ASSERT_EQ(classifier_chunk_rows(spec, pol), 1024);
  ASSERT_EQ(smaller, (std::vector<int64_t>{512, 256}));
  std::vector<int64_t> chunks{0};
  chunks.insert(chunks.end(), smaller.begin(), smaller.end());
  std::vector<std::vector<RecomputeCandidate>> all;
  std::set<uint64_t> budgets;
  for (int64_t rows : chunks) {
    Policy p = pol;
    p.classifier_chunk_rows = rows;
    all.push_back(plan_every_assignment(spec, p, {}, cpu_capabilities()));
    for (size_t i = 0; i < all.back().size(); i += 5) budgets.insert(all.back()[i].peak_bytes);
  }
  const double worth = 0.1 * 4.0 * double(pol.batch * pol.seq) * double(spec.n_embd) * double(spec.padded_vocab);
  int smaller_taken = 0, checked = 0;
  for (uint64_t budget : budgets) {
    RecomputeChoice want = choose_recompute_exhaustive(all[0], budget);
    for (size_t k = 1; k < chunks.size(); ++k) {
      if (want.fits && want.recompute_flops <= worth) break;
      RecomputeChoice c = choose_recompute_exhaustive(all[k], budget);
      if (c.fits && (!want.fits || c.recompute_flops < want.recompute_flops - worth)) {
        want = c;
        want.classifier_chunk_rows = chunks[k];
      }
    }
    if (!want.fits) continue;
    const RecomputeChoice got = choose_recompute(spec, pol, {}, cpu_capabilities(), budget);
    const std::string what = fmt::format("budget {}: search {} at chunk {}, exhaustive {} at chunk {}", budget,
                                         blocks_to_string(got.blocks), got.classifier_chunk_rows,
                                         blocks_to_string(want.blocks), want.classifier_chunk_rows);
    ++checked;
    ASSERT_TRUE(got.fits) << what;
    EXPECT_EQ(got.classifier_chunk_rows, want.classifier_chunk_rows) << what;
    EXPECT_NEAR(got.recompute_flops, want.recompute_flops, 1e-9 * want.recompute_flops) << what;
    EXPECT_LE(got.peak_bytes, budget) << what;
    smaller_taken += got.classifier_chunk_rows > 0;
    // The choice is what it claims: its program, with its chunk, planned again has that peak.
    Policy p = pol;
    p.recompute.mode = RecomputeMode::automatic;
    p.recompute.blocks = got.blocks;
    p.classifier_chunk_rows = got.classifier_chunk_rows;
    EXPECT_EQ(plan_memory(build_training_program(spec, p, {}, cpu_capabilities())).tier(Tier::device).peak_bytes,
              got.peak_bytes)
        << what;
  }
  EXPECT_GT(checked, 10);
  EXPECT_GT(smaller_taken, 0);
  EXPECT_LT(smaller_taken, checked);
  std::printf("%d budgets checked, a smaller chunk taken in %d\n", checked, smaller_taken);
}

}  // namespace
}  // namespace memfit
