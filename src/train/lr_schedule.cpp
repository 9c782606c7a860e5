#include "train/lr_schedule.hpp"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "core/error.hpp"

namespace memfit {

namespace {

constexpr std::pair<LrScheduleKind, std::string_view> kNames[] = {
    {LrScheduleKind::constant, "constant"},
    {LrScheduleKind::cosine, "cosine"},
    {LrScheduleKind::deepspeed_warmup, "WarmupLR"},
    {LrScheduleKind::deepspeed_warmup_decay, "WarmupDecayLR"},
    {LrScheduleKind::deepspeed_warmup_cosine, "WarmupCosineLR"},
};

// DeepSpeed's warmup fraction at iteration `it` of a warmup of `w` steps (w >= 2).
double warmup_gamma(int64_t it, int64_t w, bool linear) {
  return linear ? double(it) / double(w) : 1.0 / std::log(double(w)) * std::log(double(it + 1));
}

}  // namespace

std::string_view lr_schedule_name(LrScheduleKind k) {
  for (const auto& [kind, name] : kNames)
    if (kind == k) return name;
  return "?";
}

LrScheduleKind parse_lr_schedule(std::string_view s) {
  for (const auto& [kind, name] : kNames)
    if (name == s) return kind;
  throw Error("train", fmt::format("unknown learning-rate schedule '{}' (expected constant, cosine, WarmupLR, "
                                   "WarmupDecayLR or WarmupCosineLR)", s));
}

void LrSchedule::validate() const {
  MEMFIT_CHECK(std::isfinite(lr) && lr >= 0, "train", "--lr must be a number >= 0 (got {})", lr);
  MEMFIT_CHECK(warmup >= 0, "train", "--warmup must be >= 0 (got {})", warmup);
  if (deepspeed()) {
    MEMFIT_CHECK(warmup >= 1, "config", "scheduler.params.warmup_num_steps must be a positive integer (got {})", warmup);
    MEMFIT_CHECK(std::isfinite(warmup_min_lr) && warmup_min_lr >= 0, "config",
                 "the scheduler's warmup start must be a number >= 0 (got {})", warmup_min_lr);
    MEMFIT_CHECK(kind == LrScheduleKind::deepspeed_warmup || decay_steps >= 1, "config",
                 "scheduler.params.total_num_steps must be a positive integer (got {})", decay_steps);
    MEMFIT_CHECK(std::isfinite(warmup_min_ratio) && warmup_min_ratio >= 0 && warmup_min_ratio <= 1, "config",
                 "scheduler.params.warmup_min_ratio must be a number in [0, 1] (got {})", warmup_min_ratio);
    MEMFIT_CHECK(std::isfinite(cos_min_ratio) && cos_min_ratio >= 0, "config",
                 "scheduler.params.cos_min_ratio must be a number >= 0 (got {})", cos_min_ratio);
    return;
  }
  if (kind != LrScheduleKind::cosine) return;
  MEMFIT_CHECK(std::isfinite(min_lr) && min_lr >= 0 && min_lr <= lr, "train",
               "--min-lr must be in [0, --lr = {}] (got {})", lr, min_lr);
  MEMFIT_CHECK(decay_steps > warmup, "train", "the cosine decay must end after the warmup: --decay-steps {} <= --warmup {}",
               decay_steps, warmup);
}

double LrSchedule::at(int64_t step) const {
  if (deepspeed()) {
    // DeepSpeed's last_batch_iteration when optimizer step `step` runs.
    const int64_t it = step - 2, w = std::max<int64_t>(2, warmup);
    if (kind == LrScheduleKind::deepspeed_warmup_cosine) {
      if (it < 0) return 0.0;
      if (it < w) return lr * (warmup_min_ratio + warmup_gamma(it, w, linear_warmup) * (1.0 - warmup_min_ratio));
      const double progress = std::min(1.0, double(it - w + 1) / double(std::max<int64_t>(1, decay_steps - w)));
      const double ratio = (1 + std::cos(std::numbers::pi * progress)) / 2;
      return lr * std::max(0.0, cos_min_ratio + (1.0 - cos_min_ratio) * ratio);
    }
    if (it < 0) return warmup_min_lr;
    double gamma = 1.0;
    if (it < w) gamma = warmup_gamma(it, w, linear_warmup);
    else if (kind == LrScheduleKind::deepspeed_warmup_decay)
      gamma = std::max(0.0, double(decay_steps - it) / std::max(1.0, double(decay_steps - w)));
    return warmup_min_lr + (lr - warmup_min_lr) * gamma;
  }
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
  if (deepspeed()) {
    if (kind == LrScheduleKind::deepspeed_warmup_cosine) j["warmup_min_ratio"] = warmup_min_ratio;
    else j["warmup_min_lr"] = warmup_min_lr;
    j["warmup_type"] = linear_warmup ? "linear" : "log";
    if (kind != LrScheduleKind::deepspeed_warmup) j["total_num_steps"] = decay_steps;
    if (kind == LrScheduleKind::deepspeed_warmup_cosine) j["cos_min_ratio"] = cos_min_ratio;
  }
  return j;
}

}  // namespace memfit
