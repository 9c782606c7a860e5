// `memfit max-batch`: the largest micro-batch that fits a memory budget under a policy, found
// by searching plans (plan/search.hpp: doubling, then bisection; nothing runs), then verified
// by running one real training step at the answer (the arena's measured high-water mark must
// equal the planned peak and fit the budget). With --seq auto it searches each sequence
// length from the model's context down by halves to 16, prints the largest batch at each
// (the frontier), and answers the longest sequence at which a batch fits, with its largest
// batch: context is what a shorter sequence gives up, so it is not traded for batch rows.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kernels/backend.hpp"
#include "train/run_config.hpp"

namespace memfit {

struct MaxBatchAnswer {
  int64_t seq = 0;
  int64_t batch = 0;        // 0: not even batch 1 fits
  uint64_t peak = 0;        // planned device peak at the answer
  uint64_t next_peak = 0;   // at batch + 1 (the first that does not fit)
  int plans = 0;            // candidates planned by the search
  std::vector<std::pair<int64_t, int64_t>> frontier;  // (seq, largest batch), --seq auto
};

MaxBatchAnswer search_max_batch(const RunConfig& config, bool seq_auto, uint64_t budget, const Backend& backend);

struct StepCheck {
  bool ran = false;
  std::string why_not;      // when not run
  uint64_t planned = 0, measured = 0;
  bool ok() const { return ran && planned == measured; }
};
// One real training step of `config` (validation: one batch), its device high-water mark.
StepCheck run_one_step(RunConfig config, uint64_t budget);

// The command: search, verify (unless !verify), print the plans at the answer and at
// answer + 1 to `out` (as JSON when as_json). Throws [max-batch] when nothing fits.
void max_batch_command(const RunConfig& config, bool seq_auto, bool verify, bool as_json, std::ostream& out);

}  // namespace memfit
