// Out-of-memory before it happens. When a run's planned device peak exceeds its budget, the
// run stops before step 1 with a diagnosis: the budget, the planned peak and by how much it
// overflows, the op and the categories at the peak, the largest tensors live there, and the
// changes that make it fit. Every suggestion comes from building and planning the changed
// run for real (train/candidates.hpp), never from a formula, and carries the flags that
// apply it, as the run accepts them when appended to the command (make_runnable); they are
// ordered cheapest first:
//   same math (smaller classifier chunks; a smaller micro-batch with gradient accumulation
//   keeping the global batch; ZeRO stages 1-2 over the run's ranks) < more compute
//   (recomputation, flash attention; by the extra FLOPs per token of the changed program)
//   < more communication (ZeRO stage 3) < more disk I/O (offload) < lower precision (bf16,
//   8-bit optimizer state, an NF4 frozen base) < a different training run (a smaller global
//   batch, shorter sequences) < a change of what trains (LoRA adapters on a frozen base, then
//   also stored in NF4), tried only when nothing that trains every weight fits.
// Techniques that help without fitting alone are tried in pairs (and with the accumulation
// that keeps the global batch); a combination costs what its dearer part costs, and a few
// of the cheapest per cost class are shown.
// Techniques this build refuses ("not supported") are listed as unavailable and skipped.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "kernels/backend.hpp"
#include "plan/breakdown.hpp"
#include "train/trainer.hpp"

namespace memfit {

// Cheapest first. more_communication: the same math, with more bytes between the ranks (ZeRO
// stage 3). more_io: the same math, with bytes streamed to and from disk every step.
// changes_what_trains: only adapters train (LoRA); the result is another model. A pair of
// changes costs what its dearer part costs.
enum class ChangeCost : uint8_t {
  same_math,
  more_compute,
  more_communication,
  more_io,
  lower_precision,
  different_run,
  changes_what_trains
};

struct FitSuggestion {
  std::string flags;     // e.g. "--batch 2 --grad-accum 2"
  std::string effect;    // e.g. "same global batch (8 sequences per optimizer step)"
  ChangeCost cost = ChangeCost::same_math;
  double extra_compute = 0;  // FLOPs per token relative to the current run, minus one
  uint64_t peak = 0;         // planned bytes in memory with the change (train/candidates.hpp memory_peak)
  int parts = 1;             // changes combined (a technique with a smaller batch, a pair of techniques)
  bool fits = false;
};

struct BudgetDiagnosis {
  uint64_t budget = 0, peak = 0;
  int peak_op = -1;
  Category largest_category = Category::parameters;
  std::vector<LiveTensor> live_at_peak;     // largest first
  std::vector<FitSuggestion> suggestions;   // fitting ones first, cheapest first
  std::vector<std::string> unavailable;     // flags of candidates this build refuses
  std::string report;                       // the multi-line diagnosis (indented lines, no headline)
  std::string summary;                      // one line: the numbers and the cheapest fix
};

// Plans the candidates; call only when run's plan exceeds budget.
BudgetDiagnosis diagnose_budget(const RunConfig& config, const PreparedRun& run, uint64_t budget,
                                const Backend& backend);

// Does nothing when the device peak fits the budget. Otherwise writes the diagnosis to `log`
// and throws [plan] with its one-line summary.
void enforce_memory_budget(const RunConfig& config, const PreparedRun& run, uint64_t budget, const Backend& backend,
                           std::ostream& log);

}  // namespace memfit
