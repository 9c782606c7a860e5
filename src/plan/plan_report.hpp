// How a MemoryPlan is shown: a table for people and a JSON object for machines. Both `memfit
// plan` and `memfit train` (and its --report-json) use these, so the numbers always agree.
#pragma once

#include <array>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "graph/program.hpp"
#include "plan/memory_plan.hpp"

namespace memfit {

using TierBytes = std::array<uint64_t, kNumTiers>;

// Per tier: bytes per category at the peak, free bytes inside the arena at the peak, the
// peak and the op at the peak, and the best-possible peak (largest live total); first, the
// optimizer state and its bytes per trainable parameter.
std::string format_memory_table(const Program& program, const MemoryPlan& plan);

// The "memory" object of reports:
//   planned_peak_bytes.{device,host,disk}, planned_by_category.<category> (device tier, at its
//   peak), planned_free_at_peak_bytes, peak_op {index, name, kind, phase, layer},
//   max_live_bytes, packing_ratio, tiers.<tier>.{...same per tier...},
//   optimizer_state_bytes and optimizer_state_bytes_per_parameter (of trainable parameters),
//   saved_activations_by_layer (plan/saved_activations.hpp),
//   and measured_peak_bytes.{device,host,disk} when `measured` is given.
nlohmann::json memory_json(const Program& program, const MemoryPlan& plan,
                           const std::optional<TierBytes>& measured = std::nullopt);

}  // namespace memfit
