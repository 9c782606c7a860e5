#include "train/lr_schedule.hpp"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "core/error.hpp"

namespace memfit {

std::string_view lr_schedule_name(LrScheduleKind k) { return k == LrScheduleKind::constant ? "constant" : "cosine"; }

LrScheduleKind parse_lr_schedule(std::string_view s) {
  if (s == "constant") return LrScheduleKind::constant;
  if (s == "cosine") return LrScheduleKind::cosine;
  throw Error("train", fmt::format("unknown learning-rate schedule '{}' (expected constant or cosine)", s));
}

void LrSchedule::validate() const {
  MEMFIT_CHECK(std::isfinite(lr) && lr >= 0, "train", "--lr must be a number >= 0 (got {})", lr);
  MEMFIT_CHECK(warmup >= 0, "train", "--warmup must be >= 0 (got {})", warmup);
  if (kind != LrScheduleKind::cosine) return;
  MEMFIT_CHECK(std::isfinite(min_lr) && min_lr >= 0 && min_lr <= lr, "train",
               "--min-lr must be in [0, --lr = {}] (got {})", lr, min_lr);
  MEMFIT_CHECK(decay_steps > warmup, "train", "the cosine decay must end after the warmup: --decay-steps {} <= --warmup {}",
               decay_steps, warmup);
}

double LrSchedule::at(int64_t step) const {
  if (step <= warmup) return lr * double(step) / double(warmup);
  if (kind == LrScheduleKind::constant) return lr;
  const double progress = std::min(1.0, double(step - warmup) / double(decay_steps - warmup));
  return min_lr + (lr - min_lr) * 0.5 * (1.0 + std::cos(std::numbers::pi * progress));
}

nlohmann::json LrSchedule::to_json() const {
  nlohmann::json j = {{"kind", lr_schedule_name(kind)}, {"lr", lr}, {"warmup", warmup}};
  if (kind == LrScheduleKind::cosine) {
    j["min_lr"] = min_lr;
    j["decay_steps"] = decay_steps;
  }
  return j;
}

}  // namespace memfit
