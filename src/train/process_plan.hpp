// The process's memory, planned: what the run's RSS should peak at, beside the tiers' exact
// plans. Every tier the backend keeps in process memory (the CPU backend's device and host
// arenas) is mapped and pre-faulted at its planned size; around them the process holds what
// it held before any tier was allocated (code, libraries, MPI's shared-memory segments, the
// communicators' ring scratch: measured at that moment), the tensor staging buffer and the
// batch buffers. The report sets the peak RSS beside this plan and says whether it is within
// 2% + 25 MiB of it (DESIGN's tolerance for what the libraries add: oneDNN's kernels, OpenMP's
// threads).
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

namespace memfit {

struct RunState;

struct ProcessPlan {
  uint64_t before_tiers = 0;   // RSS once the communicators exist, before any tier is allocated
  uint64_t communication = 0;  // of which: the communicators' ring scratch
  uint64_t tiers = 0;          // planned peaks of the tiers held in process memory
  uint64_t staging = 0;        // the tensor staging buffer, the batch buffers and an OLoRA / PiSSA start's panels
  uint64_t planned() const { return before_tiers + tiers + staging; }
};

constexpr uint64_t kProcessToleranceBytes = uint64_t(25) << 20;
constexpr double kProcessToleranceShare = 0.02;
bool within_process_tolerance(uint64_t planned, uint64_t rss);

// Measured and summed just before the executor allocates its tiers.
ProcessPlan plan_process(const RunState& s);
std::string describe_process_plan(const ProcessPlan& p);
// One line: the peak RSS against the plan, and whether it is within the tolerance.
std::string describe_process_check(const ProcessPlan& p, uint64_t max_rss);
nlohmann::json process_json(const ProcessPlan& p, uint64_t max_rss);

}  // namespace memfit
