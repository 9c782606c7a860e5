// `memfit consolidate CKPT --out DIR [--max-shard-size SIZE]`: the HF weights of a training
// checkpoint of any layout, as `--save` writes them (train/checkpoint_consolidate.hpp).
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <ostream>
#include <string>

namespace memfit::cli {

class ConsolidateCommand {
 public:
  explicit ConsolidateCommand(CLI::App& app);  // adds the subcommand's options to app
  bool parsed() const;
  int run(std::ostream& out) const;  // throws memfit::Error

 private:
  CLI::App* app_ = nullptr;
  std::string checkpoint_, out_, max_shard_size_ = "5GB";
};

}  // namespace memfit::cli
