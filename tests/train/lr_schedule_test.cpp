// The learning-rate schedule against closed-form values: linear warmup from 0, then constant
// or half a cosine from the peak down to the floor, kept after the decay ends.
#include <gtest/gtest.h>

#include <cmath>
#include <numbers>

#include "core/error.hpp"
#include "train/lr_schedule.hpp"
#include "train/run_config.hpp"

namespace memfit {
namespace {

TEST(LrSchedule, LinearWarmupThenConstant) {
  LrSchedule s;
  s.lr = 1e-3;
  s.warmup = 10;
  s.validate();
  EXPECT_DOUBLE_EQ(s.at(1), 1e-4);
  EXPECT_DOUBLE_EQ(s.at(5), 5e-4);
  EXPECT_DOUBLE_EQ(s.at(10), 1e-3);
  EXPECT_DOUBLE_EQ(s.at(11), 1e-3);
  EXPECT_DOUBLE_EQ(s.at(100000), 1e-3);
  s.warmup = 0;
  EXPECT_DOUBLE_EQ(s.at(1), 1e-3);
}

TEST(LrSchedule, CosineDecayToTheFloor) {
  LrSchedule s;
  s.kind = LrScheduleKind::cosine;
  s.lr = 6e-4;
  s.min_lr = 6e-5;
  s.warmup = 100;
  s.decay_steps = 1100;
  s.validate();
  EXPECT_DOUBLE_EQ(s.at(50), 3e-4);
  EXPECT_DOUBLE_EQ(s.at(100), 6e-4);
  EXPECT_NEAR(s.at(350), 6e-5 + 5.4e-4 * 0.5 * (1 + std::sqrt(0.5)), 1e-15);  // a quarter: cos(pi/4)
  EXPECT_NEAR(s.at(600), 3.3e-4, 1e-15);                                      // halfway: the mean
  EXPECT_NEAR(s.at(850), 6e-5 + 5.4e-4 * 0.5 * (1 - std::sqrt(0.5)), 1e-15);
  EXPECT_DOUBLE_EQ(s.at(1100), 6e-5);
  EXPECT_DOUBLE_EQ(s.at(5000), 6e-5);
  for (int64_t t = 101; t <= 1100; ++t) ASSERT_LT(s.at(t), s.at(t - 1)) << "step " << t;
}

TEST(LrSchedule, RunDefaultsAndRefusals) {
  RunConfig c;
  c.lr = 2e-3;
  c.steps = 300;
  c.lr_schedule = LrScheduleKind::cosine;
  const LrSchedule s = lr_schedule_of(c);
  EXPECT_DOUBLE_EQ(s.min_lr, 2e-4);  // lr / 10
  EXPECT_EQ(s.decay_steps, 300);     // the last step
  EXPECT_DOUBLE_EQ(s.at(300), 2e-4);
  EXPECT_DOUBLE_EQ(s.at(1), 2e-4 + 1.8e-3 * 0.5 * (1 + std::cos(std::numbers::pi / 300)));

  auto error = [](RunConfig bad) {
    try {
      lr_schedule_of(bad);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  RunConfig bad = c;
  bad.min_lr = 1.0;
  EXPECT_NE(error(bad).find("--min-lr"), std::string::npos) << error(bad);
  bad = c;
  bad.warmup_steps = 300;
  EXPECT_NE(error(bad).find("--decay-steps"), std::string::npos) << error(bad);
  bad = c;
  bad.warmup_steps = -1;
  EXPECT_NE(error(bad).find("--warmup"), std::string::npos) << error(bad);
  EXPECT_THROW(parse_lr_schedule("linear"), Error);
  EXPECT_EQ(parse_lr_schedule("cosine"), LrScheduleKind::cosine);
}

}  // namespace
}  // namespace memfit
