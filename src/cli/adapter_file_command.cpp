#include "cli/adapter_file_command.hpp"

namespace memfit::cli {

AdapterFileCommand::AdapterFileCommand(CLI::App& app, const std::string& load_help, const std::string& adapter_help,
                                       const std::string& out_help) {
  app.add_option("--model", model_, "the base model: a preset, an HF config.json or a directory holding one")
      ->required();
  app.add_option("--load", load_, load_help)->required();
  app.add_option("--adapter", adapter_, adapter_help)->required();
  app.add_option("--out", out_, out_help)->required();
}

}  // namespace memfit::cli
