// ZeRO++ hpZ's secondary partitions in a plan (graph/zero.hpp): what `memfit plan` prints under
// the memory table, so the cost of hpZ's trade (device memory for intra-node backward gathers)
// is visible next to the communication split.
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "plan/memory_plan.hpp"

namespace memfit {

struct HpzSummary {
  int buckets = 0;           // secondary partitions (one per bucket a backward op reads)
  uint64_t bytes = 0;        // all of them
  uint64_t largest = 0;      // the largest one
  uint64_t at_peak = 0;      // live while the device tier peaks
};
// Read from the tensors the ZeRO pass names zero.params.<bucket>.secondary; all zero without hpZ.
HpzSummary hpz_summary(const Program& p, const MemoryPlan& plan);
std::string describe_hpz(const HpzSummary& s, int partition);  // one line; empty without hpZ
nlohmann::json hpz_json(const HpzSummary& s, int partition);

}  // namespace memfit
