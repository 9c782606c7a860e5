// The learning rate of every optimizer step: linear warmup from 0, then constant or a cosine
// decay to a floor (the schedule of GPT-2/3 and Chinchilla training runs, nanoGPT's get_lr).
// Steps are 1-based: step 1 of a 10-step warmup uses lr / 10, step 10 uses lr.
// The deepspeed_* kinds are DeepSpeed's WarmupLR, WarmupDecayLR and WarmupCosineLR as its engine
// applies them: the scheduler advances once after every applied optimizer step, so step 1 runs at
// the value set when the scheduler is built (warmup_min_lr; 0 for WarmupCosineLR) and step k >= 2
// at the formula's value for iteration k - 2; the warmup is log-shaped unless `linear_warmup`,
// and at least 2 steps long.
#pragma once

#include <cstdint>
#include <string_view>

#include <nlohmann/json.hpp>

namespace memfit {

enum class LrScheduleKind : uint8_t { constant, cosine, deepspeed_warmup, deepspeed_warmup_decay, deepspeed_warmup_cosine };
std::string_view lr_schedule_name(LrScheduleKind k);
LrScheduleKind parse_lr_schedule(std::string_view s);  // throws [train]

struct LrSchedule {
  LrScheduleKind kind = LrScheduleKind::constant;
  double lr = 1e-3;         // peak learning rate
  int64_t warmup = 0;       // steps of linear warmup
  double min_lr = 0;        // cosine: the floor
  int64_t decay_steps = 0;  // cosine: the step at which the floor is reached (and kept); deepspeed: total_num_steps
  // DeepSpeed kinds: the warmup's start (warmup_min_lr; WarmupCosineLR: warmup_min_ratio, a
  // share of lr), its shape, and WarmupCosineLR's floor as a share of lr.
  double warmup_min_lr = 0;
  double warmup_min_ratio = 0;
  bool linear_warmup = false;
  double cos_min_ratio = 0;

  bool deepspeed() const { return kind >= LrScheduleKind::deepspeed_warmup; }

  // Throws [train] naming the flag: negative values, a floor above the peak, a cosine decay
  // that ends before its warmup does.
  void validate() const;
  double at(int64_t step) const;
  nlohmann::json to_json() const;
};

}  // namespace memfit
