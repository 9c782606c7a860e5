// `memfit eval`: registers the subcommand (the model, precision and data flags of `memfit train`,
// plus --batches) and runs it (train/evaluate.hpp).
#pragma once

#include <memory>
#include <ostream>

#include <CLI/CLI.hpp>

#include "cli/options.hpp"

namespace memfit::cli {

class EvalCommand {
 public:
  explicit EvalCommand(CLI::App& app);
  bool parsed() const { return command_->parsed(); }
  int run(std::ostream& out) const;

 private:
  CLI::App* command_ = nullptr;
  std::unique_ptr<RunOptions> options_;
  int64_t batches_ = 0;
};

}  // namespace memfit::cli
