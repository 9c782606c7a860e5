// The learning rate of every optimizer step: linear warmup from 0, then constant or a cosine
// decay to a floor (the schedule of GPT-2/3 and Chinchilla training runs, nanoGPT's get_lr).
// Steps are 1-based: step 1 of a 10-step warmup uses lr / 10, step 10 uses lr.
#pragma once

#include <cstdint>
#include <string_view>

#include <nlohmann/json.hpp>

namespace memfit {

enum class LrScheduleKind : uint8_t { constant, cosine };
std::string_view lr_schedule_name(LrScheduleKind k);
LrScheduleKind parse_lr_schedule(std::string_view s);  // throws [train]

struct LrSchedule {
  LrScheduleKind kind = LrScheduleKind::constant;
  double lr = 1e-3;         // peak learning rate
  int64_t warmup = 0;       // steps of linear warmup
  double min_lr = 0;        // cosine: the floor
  int64_t decay_steps = 0;  // cosine: the step at which the floor is reached (and kept)

  // Throws [train] naming the flag: negative values, a floor above the peak, a cosine decay
  // that ends before its warmup does.
  void validate() const;
  double at(int64_t step) const;
  nlohmann::json to_json() const;
};

}  // namespace memfit
