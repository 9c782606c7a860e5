#include "cli/eval_command.hpp"

#include "core/error.hpp"
#include "train/evaluate.hpp"

namespace memfit::cli {

EvalCommand::EvalCommand(CLI::App& app) {
  command_ = app.add_subcommand(
      "eval", "loss and perplexity of a model (--load) on a token file (--data), with no training and no optimizer memory");
  options_ = std::make_unique<RunOptions>(*command_, true);
  command_->add_option("--batches", batches_, "evaluate the first N batches of the file (default: every whole batch)");
}

int EvalCommand::run(std::ostream& out) const {
  MEMFIT_CHECK(batches_ >= 0, "cli", "--batches must be at least 0 (0: every whole batch), got {}", batches_);
  MEMFIT_CHECK(!options_->seq_auto(), "policy", "--seq auto is only for max-batch; give a sequence length");
  run_evaluation(options_->resolve(), batches_, out);
  return 0;
}

}  // namespace memfit::cli
