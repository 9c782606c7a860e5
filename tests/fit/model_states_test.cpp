// ZeRO sharding of model states per rank (fit/model_states.hpp) against the published
// numbers: the ZeRO paper's Psi = 7.5B on 64 ranks, fp32 Adam for a 7B model on 3 ranks, and
// Llama-2-7B in bf16 with bf16 gradients on 8 ranks from the real program's tensors.
#include <gtest/gtest.h>

#include "core/error.hpp"
#include "fit/model_states.hpp"
#include "graph/training_program.hpp"
#include "kernels/backend.hpp"

namespace memfit {
namespace {

constexpr double GB = 1e9, GiB = 1073741824.0;

std::array<double, 4> per_stage(const StateElements& e, int world, double unit) {
  std::array<double, 4> out{};
  for (int stage = 0; stage < 4; ++stage) out[size_t(stage)] = double(shard_model_states(e, stage, world).device_total()) / unit;
  return out;
}

TEST(ModelStates, ZeroPaperMixedPrecisionAdam) {
  // 2 + 2 + 12 bytes per parameter: 16-bit weights and gradients, fp32 master, m and v.
  const int64_t psi = 7'500'000'000;
  const StateElements e = {{{Category::parameters, DType::bf16}, psi},
                           {{Category::gradients, DType::bf16}, psi},
                           {{Category::master_weights, DType::f32}, psi},
                           {{Category::optimizer_state, DType::f32}, 2 * psi}};
  const auto gb = per_stage(e, 64, GB);
  EXPECT_NEAR(gb[0], 120, 0.05);
  EXPECT_NEAR(gb[1], 31.4, 0.05);
  EXPECT_NEAR(gb[2], 16.6, 0.05);
  EXPECT_NEAR(gb[3], 1.9, 0.05);
}

TEST(ModelStates, Fp32AdamSevenBillionOnThreeRanks) {
  const int64_t psi = 7'000'000'000;
  const StateElements e = {{{Category::parameters, DType::f32}, psi},
                           {{Category::gradients, DType::f32}, psi},
                           {{Category::optimizer_state, DType::f32}, 2 * psi}};
  const auto gb = per_stage(e, 3, GB);
  EXPECT_NEAR(gb[0], 112, 0.05);
  EXPECT_NEAR(gb[1], 74.7, 0.05);
  EXPECT_NEAR(gb[2], 56, 0.05);
  EXPECT_NEAR(gb[3], 37.3, 0.05);
}

TEST(ModelStates, Llama2SevenBillionBf16OnEightRanksFromTheProgram) {
  Policy pol;
  pol.batch = 1;
  pol.seq = 16;
  pol.precision = Precision::bf16;
  pol.grad_dtype = DType::bf16;
  pol.with_eval = false;
  const Program p = build_training_program(model_preset("llama-2-7b"), pol, {}, cpu_capabilities());
  const StateElements e = model_state_elements(p);
  EXPECT_EQ((e.at({Category::parameters, DType::bf16})), 6'738'415'616);
  const auto gib = per_stage(e, 8, GiB);
  EXPECT_NEAR(gib[0], 100.4, 0.05);
  EXPECT_NEAR(gib[1], 34.5, 0.05);
  EXPECT_NEAR(gib[2], 23.5, 0.05);
  EXPECT_NEAR(gib[3], 12.55, 0.005);
}

TEST(ModelStates, ShardsArePaddedAndOffloadMovesTiers) {
  const StateElements e = {{{Category::parameters, DType::f32}, 10}, {{Category::optimizer_state, DType::f32}, 20}};
  const ShardedStates s = shard_model_states(e, 3, 3);
  EXPECT_EQ(s.device[size_t(Category::parameters)], 4u * 4);       // ceil(10 / 3) elements
  EXPECT_EQ(s.device[size_t(Category::optimizer_state)], 7u * 4);  // ceil(20 / 3)
  const ShardedStates o = shard_model_states(e, 3, 3, Tier::host, Tier::disk);
  EXPECT_EQ(o.device_total(), 0u);
  EXPECT_EQ(o.host[size_t(Category::optimizer_state)], 7u * 4);
  EXPECT_EQ(o.disk[size_t(Category::parameters)], 4u * 4);
  EXPECT_THROW(shard_model_states(e, 4, 2), Error);
}

}  // namespace
}  // namespace memfit
