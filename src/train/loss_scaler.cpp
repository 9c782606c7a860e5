// The loss scaler's state machine (see loss_scaler.hpp). The DeepSpeed rule counts
// iterations since the last overflow and grows when that count is a multiple of the window;
// counting clean steps since the last growth or overflow, as here, gives the same steps.
#include "train/loss_scaler.hpp"

#include <algorithm>
#include <cmath>

#include "core/error.hpp"

namespace memfit {

std::string_view loss_scale_convention_name(LossScaleConvention c) {
  return c == LossScaleConvention::pytorch ? "pytorch" : "deepspeed";
}

LossScaleConvention parse_loss_scale_convention(std::string_view s) {
  if (s == "pytorch" || s == "torch") return LossScaleConvention::pytorch;
  if (s == "deepspeed") return LossScaleConvention::deepspeed;
  throw Error("config", fmt::format("unknown loss-scaler convention '{}' (expected pytorch or deepspeed)", s));
}

void LossScaleConfig::validate() const {
  MEMFIT_CHECK(fixed_scale >= 0 && std::isfinite(fixed_scale), "config", "the loss scale must be >= 0 (got {})",
               fixed_scale);
  MEMFIT_CHECK(initial_scale > 0 && std::isfinite(initial_scale) && initial_scale <= 0x1p100, "config",
               "the initial loss scale must be in (0, 2^100] (got {})", initial_scale);
  MEMFIT_CHECK(window >= 0, "config", "the loss-scale window must be positive (got {})", window);
  MEMFIT_CHECK(hysteresis >= 0, "config", "the hysteresis must be positive (got {})", hysteresis);
  MEMFIT_CHECK(min_scale > 0 && std::isfinite(min_scale), "config", "the minimum loss scale must be > 0 (got {})",
               min_scale);
}

int64_t LossScaleConfig::resolved_window() const {
  if (window > 0) return window;
  return convention == LossScaleConvention::pytorch ? 2000 : 1000;
}

int LossScaleConfig::resolved_hysteresis() const {
  if (convention == LossScaleConvention::pytorch) return 1;
  return hysteresis > 0 ? hysteresis : 2;
}

LossScaler::LossScaler(const LossScaleConfig& config)
    : config_(config),
      scale_(config.fixed_scale > 0 ? config.fixed_scale : config.initial_scale),
      hysteresis_(config.resolved_hysteresis()) {
  config_.validate();
}

void LossScaler::restore(const State& s) {
  MEMFIT_CHECK(s.scale > 0 && s.clean >= 0 && s.skipped >= 0 && s.hysteresis >= 1, "train",
               "invalid loss-scaler state (scale {}, hysteresis {})", s.scale, s.hysteresis);
  scale_ = s.scale, clean_ = s.clean, skipped_ = s.skipped, hysteresis_ = s.hysteresis;
}

LossScaler::Outcome LossScaler::update(bool overflow) {
  const int delayed = config_.resolved_hysteresis();
  if (overflow) {
    ++skipped_;
    clean_ = 0;
    if (config_.fixed_scale > 0) return Outcome::exhausted;
    if (config_.convention == LossScaleConvention::pytorch) {
      if (scale_ <= config_.min_scale) return Outcome::exhausted;
      scale_ *= 0.5;
      return Outcome::skipped;
    }
    if (delayed == 1 || hysteresis_ == 1) {
      if (scale_ <= config_.min_scale) return Outcome::exhausted;
      scale_ = std::max(scale_ / 2, config_.min_scale);
    } else {
      --hysteresis_;
    }
    return Outcome::skipped;
  }
  if (config_.fixed_scale > 0) return Outcome::applied;
  if (config_.consecutive_hysteresis) hysteresis_ = delayed;
  if (++clean_ == config_.resolved_window()) {
    clean_ = 0;
    hysteresis_ = delayed;
    // GradScaler keeps the scale when doubling would overflow fp32.
    if (std::isfinite(float(scale_ * 2))) scale_ *= 2;
  }
  return Outcome::applied;
}

}  // namespace memfit
