// `memfit convert-lora --model M --load BASE --adapter DIR --out OUT`: an adapter started by
// OLoRA or PiSSA (which trains on the residual W - scale B0 A0, so it needs that residual as its
// base) as a plain LoRA adapter of the original base, as PEFT's save_pretrained with
// path_initial_model_for_weight_conversion writes it: W - scale B0 A0 + scale B A = W +
// scale [B, -B0] [A; A0], so rank 2r with lora_alpha 2 alpha (sqrt(2) alpha with rsLoRA) keeps the
// scale, init_lora_weights true. B0 and A0 are computed again from BASE as the run computed them.
// Such an adapter loads onto the untouched base (and beside other adapters) in PEFT and memfit.
#pragma once

#include <CLI/CLI.hpp>

#include <ostream>
#include <string>

#include "cli/adapter_file_command.hpp"

namespace memfit::cli {

class ConvertLoraCommand : AdapterFileCommand {
 public:
  explicit ConvertLoraCommand(CLI::App& app);  // adds the subcommand's options to app
  int run(std::ostream& out) const;            // throws memfit::Error
};

}  // namespace memfit::cli
