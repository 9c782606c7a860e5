// `memfit merge-lora --model M --load BASE --adapter DIR --out OUT`: the HF weights of BASE with
// the PEFT LoRA adapter in DIR merged in, W + (lora_alpha / r) B A (GPT-2's Conv1D weights,
// stored [in, out], get the transpose), written as --save writes weights: OUT/model.safetensors
// (fp32; sharded above 5 GB, as --save) and OUT/config.json, which transformers loads as the
// base model's class. The merge goes file to file, one tensor at a time, with no program.
#pragma once

#include <CLI/CLI.hpp>

#include <ostream>
#include <string>

#include "cli/adapter_file_command.hpp"

namespace memfit::cli {

class MergeLoraCommand : AdapterFileCommand {
 public:
  explicit MergeLoraCommand(CLI::App& app);  // adds the subcommand's options to app
  int run(std::ostream& out) const;          // throws memfit::Error
};

}  // namespace memfit::cli
