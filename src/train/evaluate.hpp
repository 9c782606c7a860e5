// `memfit eval`: the loss and perplexity of a model on a token file, with no training. The
// program is graph/eval_program.hpp's (no gradient, master weight or optimizer state), planned
// and measured like a training run's: the report says planned == measured and the peak RSS.
#pragma once

#include <cstdint>
#include <ostream>

#include <nlohmann/json.hpp>

#include "train/run_config.hpp"

namespace memfit {

// Evaluates config.model (weights from config.load, else a seeded initialisation, which the log
// says) on config.data in consecutive batches of config.policy.batch x seq from the start of the
// file: every whole batch it holds, or the first max_batches (> 0). Logs a summary to `log` and
// returns the report (also written to config.report_json when set). Throws [eval] when the file
// holds no whole batch, [data] for a token outside the vocabulary.
nlohmann::json run_evaluation(const RunConfig& config, int64_t max_batches, std::ostream& log);

}  // namespace memfit
