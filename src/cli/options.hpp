// Command-line options shared by `memfit train` and `memfit plan`. Flags are applied after
// the JSON config file (--config), so a flag always wins over the file.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "train/run_config.hpp"

namespace memfit::cli {

class RunOptions {
 public:
  // Registers model, policy and (when `training`) data/loop flags on `app`.
  RunOptions(CLI::App& app, bool training);
  // The config file (if any), then every flag that was given.
  RunConfig resolve() const;
  bool seq_auto() const { return seq_auto_; }  // --seq auto was given

 private:
  template <typename T>
  void add(CLI::App& app, const std::string& name, const std::string& help, std::function<void(RunConfig&, T)> apply);
  void add_training_options(CLI::App& app);
  void add_fine_tuning_options(CLI::App& app);
  void add_zero_plus_plus_options(CLI::App& app);
  // A switch: `--name` turns it on (off by default and in the config file unless set there).
  void add_flag(CLI::App& app, const std::string& name, const std::string& help,
                std::function<void(RunConfig&, bool)> apply);

  std::string config_file_;
  std::vector<std::function<void(RunConfig&)>> given_;
  bool seq_auto_ = false;
};

}  // namespace memfit::cli
