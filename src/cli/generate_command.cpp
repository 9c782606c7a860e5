#include "cli/generate_command.hpp"

#include "core/error.hpp"
#include "train/run_config.hpp"

namespace memfit::cli {

namespace {

std::vector<int32_t> parse_ids(const std::string& text) {
  std::vector<int32_t> ids;
  for (size_t at = 0; at < text.size();) {
    const size_t comma = std::min(text.find(',', at), text.size());
    const std::string piece = text.substr(at, comma - at);
    const int64_t v = parse_integer_text("--prompt-ids", piece);
    MEMFIT_CHECK(v >= 0 && v <= INT32_MAX, "cli", "--prompt-ids: token id {} is out of range", v);
    ids.push_back(int32_t(v));
    at = comma + 1;
  }
  return ids;
}

}  // namespace

GenerateCommand::GenerateCommand(CLI::App& app) {
  command_ = app.add_subcommand(
      "generate", "text from a model (--load) over a KV cache: prefill and decode planned like a training step");
  options_ = std::make_unique<RunOptions>(*command_, true);
  command_->add_option("--prompt", request_.prompt, "prompt text (encoded with --tokenizer; bytes for a 256-token vocabulary)");
  command_->add_option("--prompt-ids", prompt_ids_, "prompt as token ids, e.g. 1,2,3 (instead of --prompt)");
  command_->add_option("--max-new-tokens", request_.max_new_tokens, "tokens to generate (default 32)");
  command_->add_option("--temperature", request_.sampling.temperature,
                       "0: greedy (the default, as transformers' generate without do_sample); > 0: sample at this "
                       "temperature");
  command_->add_option("--top-k", request_.sampling.top_k, "sample among the k most likely tokens (0: off)");
  command_->add_option("--top-p", request_.sampling.top_p, "sample from the smallest set of probability >= p, in (0, 1]");
  command_->add_flag("--ignore-eos", request_.ignore_eos, "do not stop at the model's eos_token_id");
}

int GenerateCommand::run(std::ostream& out) const {
  RunConfig config = options_->resolve();
  GenerateRequest request = request_;
  if (!prompt_ids_.empty()) request.prompt_ids = parse_ids(prompt_ids_);
  MEMFIT_CHECK(request.prompt.empty() || request.prompt_ids.empty(), "cli", "give --prompt or --prompt-ids, not both");
  request.sampling.seed = config.seed;
  run_generate(config, request, out);
  return 0;
}

}  // namespace memfit::cli
