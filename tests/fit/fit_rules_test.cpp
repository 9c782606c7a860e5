// --fit's rules (issue 19): every winner leaves the headroom free (closed form from the preset's
// bytes), and a near-tie goes to the simpler configuration, in the documented order of
// techniques, unless the faster one gains the tie tolerance or more.
#include <gtest/gtest.h>

#include <cmath>

#include <nlohmann/json.hpp>

#include "core/bytes.hpp"
#include "core/error.hpp"
#include "fit/fit_search.hpp"
#include "graph/recompute.hpp"
#include "support/run_cli.hpp"

namespace memfit {
namespace {

Cluster h100() {
  Cluster c;
  c.hw = hardware_preset("h100-80gb");
  return c;
}

TEST(FitRules, EveryWinnerLeavesTheHeadroomFree) {
  // nvidia-smi's 81559 MiB of an H100 80GB, less 5%.
  const uint64_t usable = uint64_t(std::floor(0.95 * double(81559ull << 20)));
  Policy base;
  base.seq = 1024;
  FitOptions o;
  o.keep = 1000;  // every family that fits
  const ModelSpec spec = model_preset("llama-2-7b");
  const FitResult r = fit_search(spec, base, h100(), {}, o);
  EXPECT_EQ(r.usable, usable);
  EXPECT_EQ(r.headroom, 0.05);
  ASSERT_GT(r.ranked.size(), 5u);
  for (const FitCandidate& f : r.ranked) {
    EXPECT_LE(f.estimate.device_bytes_of_largest_rank(), usable) << f.family;
    EXPECT_GE(f.estimate.fixed_overhead, 1 * GiB) << f.family;  // the runtime's bytes are in the peak
  }
  // The check can fail: without headroom the winners fill the GPU past 95% (issue 19: 97.5-98.6%).
  o.headroom = 0;
  const FitResult tight = fit_search(spec, base, h100(), {}, o);
  int above = 0;
  for (const FitCandidate& f : tight.ranked) above += f.estimate.device_bytes_of_largest_rank() > usable;
  EXPECT_GT(above, 0);
  o.headroom = 1;
  EXPECT_THROW(fit_search(spec, base, h100(), {}, o), Error);
}

FitCandidate candidate(const std::string& name, double tokens_per_second, void (*technique)(Policy&)) {
  FitCandidate c;
  c.policy.precision = Precision::bf16;
  c.policy.attention = AttentionKind::flash;
  if (technique) technique(c.policy);
  c.family = name;
  c.estimate.tokens_per_second = tokens_per_second;
  return c;
}

void eight_bit(Policy& p) { p.optimizer = OptimizerKind::adamw8bit; }
void param_offload(Policy& p) {
  p.zero_stage = 3;
  p.offload_optimizer = p.offload_params = Tier::host;
}

std::vector<std::string> order(std::vector<FitCandidate> c, double tolerance = 0.05) {
  rank_candidates(c, tolerance);
  std::vector<std::string> names;
  for (const FitCandidate& f : c) names.push_back(f.family);
  return names;
}

TEST(FitRules, NearTiesGoToTheSimplerConfiguration) {
  using V = std::vector<std::string>;
  // Issue 19: 8-bit state or parameter offload for +0.6% is not worth it.
  EXPECT_EQ(order({candidate("plain", 1000, nullptr), candidate("8-bit", 1006, eight_bit)}), (V{"plain", "8-bit"}));
  EXPECT_EQ(order({candidate("offload", 1006, param_offload), candidate("plain", 1000, nullptr)}),
            (V{"plain", "offload"}));
  // Beyond the tolerance the faster one wins.
  EXPECT_EQ(order({candidate("plain", 1000, nullptr), candidate("8-bit", 1060, eight_bit)}), (V{"8-bit", "plain"}));
  EXPECT_EQ(order({candidate("plain", 1000, nullptr), candidate("8-bit", 1006, eight_bit)}, 0.0), (V{"8-bit", "plain"}));
  // The bar is the fastest remaining: plain is 8% behind the fastest, so it cannot win, and the
  // simpler of the two within 5% does.
  EXPECT_EQ(order({candidate("plain", 1000, nullptr), candidate("8-bit", 1040, eight_bit),
                   candidate("offload", 1080, param_offload)}),
            (V{"8-bit", "offload", "plain"}));
  // Candidates that change what trains stay last whatever their speed.
  FitCandidate lora = candidate("lora", 5000, nullptr);
  lora.changes_training = true;
  EXPECT_EQ(order({lora, candidate("offload", 1000, param_offload)}), (V{"offload", "lora"}));
}

// The documented order: each technique outweighs every one after it put together.
TEST(FitRules, ComplexityFollowsTheDocumentedOrderOfTechniques) {
  std::vector<void (*)(Policy&)> techniques = {
      [](Policy& p) { p.offload_params = Tier::host; },
      [](Policy& p) { p.offload_optimizer = Tier::host; },
      [](Policy& p) { p.optimizer = OptimizerKind::adamw8bit; },
      [](Policy& p) { p.zero_stage = 1; },
      [](Policy& p) { p.recompute = parse_recompute("selective:attention"); },
      [](Policy& p) { p.precision = Precision::bf16; },
      [](Policy& p) { p.attention = AttentionKind::flash; }};
  Policy simplest;
  simplest.precision = Precision::fp32;
  simplest.attention = AttentionKind::plain;
  for (size_t i = 0; i < techniques.size(); ++i) {
    Policy one = simplest, rest = simplest;
    techniques[i](one);
    for (size_t j = i + 1; j < techniques.size(); ++j) techniques[j](rest);
    rest.offload_optimizer = i < 1 ? Tier::disk : rest.offload_optimizer;  // heavier tiers later in the list
    rest.zero_stage = i < 3 ? 3 : rest.zero_stage;
    rest.recompute = i < 4 ? parse_recompute("full") : rest.recompute;
    EXPECT_LT(fit_complexity(simplest), fit_complexity(one)) << i;
    EXPECT_LT(fit_complexity(rest), fit_complexity(one)) << i;
  }
  Policy host = simplest, disk = simplest;
  host.offload_params = Tier::host;
  disk.offload_params = Tier::disk;
  EXPECT_LT(fit_complexity(host), fit_complexity(disk));
}

TEST(FitRules, CliShowsAndChecksTheHeadroom) {
  auto r = test::run_memfit("plan --model gpt2-tiny --seq 64 --hardware h100-80gb --fit --headroom 0.2");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("20% headroom"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("simpler configuration"), std::string::npos) << r.out;
  r = test::run_memfit("plan --model gpt2-tiny --seq 64 --hardware h100-80gb --json");
  ASSERT_EQ(r.status, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["headroom"].get<double>(), 0.05);
  EXPECT_EQ(j["usable_bytes"].get<uint64_t>(), uint64_t(std::floor(0.95 * double(81559ull << 20))));
  // A plan between 95% and 100% of the memory does not fit by default, and does with --headroom 0.
  const uint64_t peak = j["estimate"]["per_rank"]["device_bytes"].get<uint64_t>();
  const std::string between = std::to_string(uint64_t(double(peak) / 0.97));
  r = test::run_memfit("plan --model gpt2-tiny --seq 64 --hardware h100-80gb --json --device-memory " + between);
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_FALSE(nlohmann::json::parse(r.out)["fits"].get<bool>());
  r = test::run_memfit("plan --model gpt2-tiny --seq 64 --hardware h100-80gb --json --headroom 0 --device-memory " +
                       between);
  EXPECT_TRUE(nlohmann::json::parse(r.out)["fits"].get<bool>());
  r = test::run_memfit("plan --model gpt2-tiny --seq 64 --hardware h100-80gb --headroom 1.5");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.err.find("--headroom"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace memfit
