// What memfit merge-lora and memfit convert-lora both take: the base model, its HF weights, a
// PEFT adapter directory and an output directory.
#pragma once

#include <CLI/CLI.hpp>

#include <string>

namespace memfit::cli {

class AdapterFileCommand {
 protected:
  // Adds --model, --load, --adapter and --out (all required) to app.
  AdapterFileCommand(CLI::App& app, const std::string& load_help, const std::string& adapter_help,
                     const std::string& out_help);

  std::string model_, load_, adapter_, out_;
};

}  // namespace memfit::cli
