// The loss scaler's state sequences against the documented rules of each convention, with
// every expected value worked out by hand from those rules (not from the implementation):
//   PyTorch GradScaler: init 2^16, x2 after growth_interval (2000) clean steps in a row,
//     x0.5 on an overflow, which also restarts the count; no floor, no hysteresis.
//   DeepSpeed DynamicLossScaler (fp16 block): init 2^initial_scale_power, window 1000,
//     hysteresis 2 (an overflow only lowers the scale once the hysteresis is down to 1,
//     otherwise it lowers the hysteresis), floor min_loss_scale, and an overflow at the floor
//     with no hysteresis left stops the run; growth restores the hysteresis.
#include <gtest/gtest.h>

#include "core/error.hpp"
#include "train/loss_scaler.hpp"

namespace memfit {
namespace {

using Outcome = LossScaler::Outcome;

void clean_steps(LossScaler& s, int n) {
  for (int i = 0; i < n; ++i) ASSERT_EQ(s.update(false), Outcome::applied);
}

TEST(LossScaler, PyTorchGradScalerSequence) {
  LossScaler s(LossScaleConfig{});
  EXPECT_EQ(s.scale(), 65536.0f);
  clean_steps(s, 1999);
  EXPECT_EQ(s.scale(), 65536.0f);  // 1999 clean steps: not yet
  EXPECT_EQ(s.update(false), Outcome::applied);
  EXPECT_EQ(s.scale(), 131072.0f);  // the 2000th doubles
  EXPECT_EQ(s.clean_streak(), 0);
  clean_steps(s, 1500);
  EXPECT_EQ(s.update(true), Outcome::skipped);  // overflow: halve, restart the count
  EXPECT_EQ(s.scale(), 65536.0f);
  EXPECT_EQ(s.update(true), Outcome::skipped);  // consecutive overflows halve each time
  EXPECT_EQ(s.scale(), 32768.0f);
  EXPECT_EQ(s.skipped_steps(), 2);
  clean_steps(s, 1999);
  EXPECT_EQ(s.scale(), 32768.0f);  // the 1500 earlier clean steps do not count
  clean_steps(s, 1);
  EXPECT_EQ(s.scale(), 65536.0f);
}

TEST(LossScaler, PyTorchStopsAtTheFloorInsteadOfDecayingToZero) {
  LossScaleConfig c;
  c.initial_scale = 4;
  c.min_scale = 1;
  LossScaler s(c);
  EXPECT_EQ(s.update(true), Outcome::skipped);
  EXPECT_EQ(s.scale(), 2.0f);
  EXPECT_EQ(s.update(true), Outcome::skipped);
  EXPECT_EQ(s.scale(), 1.0f);
  EXPECT_EQ(s.update(true), Outcome::exhausted);  // at the floor
}

TEST(LossScaler, DeepSpeedSequenceWithHysteresis) {
  LossScaleConfig c;
  c.convention = LossScaleConvention::deepspeed;
  c.initial_scale = 65536;  // initial_scale_power 16
  LossScaler s(c);
  EXPECT_EQ(s.hysteresis_left(), 2);
  clean_steps(s, 999);
  EXPECT_EQ(s.scale(), 65536.0f);
  clean_steps(s, 1);  // 1000 iterations since the (virtual) overflow at iteration -1
  EXPECT_EQ(s.scale(), 131072.0f);
  // First overflow: hysteresis 2 -> 1, scale kept, step still skipped.
  EXPECT_EQ(s.update(true), Outcome::skipped);
  EXPECT_EQ(s.scale(), 131072.0f);
  EXPECT_EQ(s.hysteresis_left(), 1);
  // Clean steps do not restore the hysteresis (consecutive_hysteresis is off)...
  clean_steps(s, 10);
  EXPECT_EQ(s.hysteresis_left(), 1);
  // ...so the next overflow halves.
  EXPECT_EQ(s.update(true), Outcome::skipped);
  EXPECT_EQ(s.scale(), 65536.0f);
  // And every later one too, until a growth restores the hysteresis.
  EXPECT_EQ(s.update(true), Outcome::skipped);
  EXPECT_EQ(s.scale(), 32768.0f);
  clean_steps(s, 999);
  EXPECT_EQ(s.scale(), 32768.0f);
  clean_steps(s, 1);  // 1000 clean iterations after the last overflow
  EXPECT_EQ(s.scale(), 65536.0f);
  EXPECT_EQ(s.hysteresis_left(), 2);
  EXPECT_EQ(s.skipped_steps(), 3);
}

TEST(LossScaler, DeepSpeedConsecutiveHysteresisRestoresOnEveryCleanStep) {
  LossScaleConfig c;
  c.convention = LossScaleConvention::deepspeed;
  c.consecutive_hysteresis = true;
  LossScaler s(c);
  EXPECT_EQ(s.update(true), Outcome::skipped);
  EXPECT_EQ(s.hysteresis_left(), 1);
  clean_steps(s, 1);
  EXPECT_EQ(s.hysteresis_left(), 2);
  EXPECT_EQ(s.update(true), Outcome::skipped);  // absorbed again
  EXPECT_EQ(s.scale(), 65536.0f);
}

TEST(LossScaler, DeepSpeedFloorAndExhaustion) {
  LossScaleConfig c;
  c.convention = LossScaleConvention::deepspeed;
  c.initial_scale = 8;
  c.min_scale = 3;  // not a power of two: the cut is clamped to the floor
  c.hysteresis = 1;
  c.window = 5;
  LossScaler s(c);
  EXPECT_EQ(s.update(true), Outcome::skipped);
  EXPECT_EQ(s.scale(), 4.0f);
  EXPECT_EQ(s.update(true), Outcome::skipped);
  EXPECT_EQ(s.scale(), 3.0f);  // max(4 / 2, 3)
  EXPECT_EQ(s.update(true), Outcome::exhausted);
  EXPECT_EQ(s.scale(), 3.0f);
  // With hysteresis left, an overflow at the floor only uses it up.
  c.hysteresis = 2;
  c.initial_scale = 3;
  LossScaler t(c);
  EXPECT_EQ(t.update(true), Outcome::skipped);
  EXPECT_EQ(t.update(true), Outcome::exhausted);
  // A custom window.
  LossScaler u(c);
  clean_steps(u, 5);
  EXPECT_EQ(u.scale(), 6.0f);
}

TEST(LossScaler, FixedScaleNeverMovesAndStopsOnOverflow) {
  LossScaleConfig c;
  c.fixed_scale = 128;
  LossScaler s(c);
  clean_steps(s, 5000);
  EXPECT_EQ(s.scale(), 128.0f);
  EXPECT_EQ(s.update(true), Outcome::exhausted);
}

TEST(LossScaler, RejectsBadSettings) {
  LossScaleConfig c;
  c.min_scale = 0;
  EXPECT_THROW(LossScaler{c}, Error);
  c = {};
  c.initial_scale = -1;
  EXPECT_THROW(LossScaler{c}, Error);
  EXPECT_THROW(parse_loss_scale_convention("apex"), Error);
}

}  // namespace
}  // namespace memfit
