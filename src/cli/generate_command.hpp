// `memfit generate`: registers the subcommand (the model, precision and weight flags of
// `memfit eval`, plus the prompt and sampling flags) and runs it (train/generate.hpp).
#pragma once

#include <memory>
#include <ostream>
#include <string>

#include <CLI/CLI.hpp>

#include "cli/options.hpp"
#include "train/generate.hpp"

namespace memfit::cli {

class GenerateCommand {
 public:
  explicit GenerateCommand(CLI::App& app);
  bool parsed() const { return command_->parsed(); }
  int run(std::ostream& out) const;

 private:
  CLI::App* command_ = nullptr;
  std::unique_ptr<RunOptions> options_;
  GenerateRequest request_;
  std::string prompt_ids_;
};

}  // namespace memfit::cli
