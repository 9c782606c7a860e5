#include "cli/consolidate_command.hpp"

#include "io/safetensors_shards.hpp"
#include "train/checkpoint_consolidate.hpp"

namespace memfit::cli {

ConsolidateCommand::ConsolidateCommand(CLI::App& app)
    : app_(app.add_subcommand("consolidate", "HF weights (as --save writes them) from a training checkpoint of any "
                                             "layout, one tensor at a time")) {
  app_->add_option("checkpoint", checkpoint_, "a checkpoint step directory, or a --checkpoint-dir (its newest)")
      ->required();
  app_->add_option("--out", out_, "the directory to write (model.safetensors + config.json)")->required();
  app_->add_option("--max-shard-size", max_shard_size_, "shards of at most this size, as transformers' "
                   "max_shard_size (default 5GB)");
}

bool ConsolidateCommand::parsed() const { return app_->parsed(); }

int ConsolidateCommand::run(std::ostream& out) const {
  consolidate_checkpoint(checkpoint_, out_, parse_shard_size(max_shard_size_), out);
  return 0;
}

}  // namespace memfit::cli
