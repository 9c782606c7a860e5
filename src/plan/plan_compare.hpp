// Two plans of the same run side by side, per category at each plan's device peak: what a
// technique (mixed precision, a gradient dtype) saves or costs, byte for byte. `memfit plan`
// shows it for bf16 / fp16 runs against the same run in fp32.
#pragma once

#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "plan/memory_plan.hpp"

namespace memfit {

std::string format_plan_comparison(std::string_view base_label, const MemoryPlan& base, std::string_view label,
                                   const MemoryPlan& plan);

// {"<label>": {"peak_bytes", "by_category": {...}}, "<base_label>": {...}, "saved_bytes": {...per category,
// "peak"}} with saved = base - plan (negative when the plan needs more).
nlohmann::json plan_comparison_json(std::string_view base_label, const MemoryPlan& base, std::string_view label,
                                    const MemoryPlan& plan);

}  // namespace memfit
