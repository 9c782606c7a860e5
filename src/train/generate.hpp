// `memfit generate` and train's --sample-every: text from a model through the generate
// section of a planned program (graph/inference_program.hpp). A Generator drives an executor
// whose program holds that section: it writes the prompt, runs the prefill ops once and the
// decode ops once per new token (StepContext::position: where the run's tokens sit), reads
// the last position's logits and picks the next token (train/sampling.hpp).
// Invariant: every buffer is allocated when the Generator is built; generate() allocates
// nothing (tested with interposed malloc), so the token loop runs in planned memory only.
#pragma once

#include <cstdint>
#include <optional>
#include <ostream>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "graph/inference_program.hpp"
#include "runtime/executor.hpp"
#include "text/tokenizer.hpp"
#include "train/run_config.hpp"
#include "train/sampling.hpp"

namespace memfit {

class Generator {
 public:
  // `ex` runs a program with a generate section; `vocab` real tokens of the padded row.
  Generator(Executor& ex, int64_t vocab);
  const GenerateOps& ops() const { return ops_; }

  // Runs the prefill over `prompt` (exactly the planned prompt length) and returns the last
  // position's logits (vocab values, valid until the next call).
  std::span<const float> prefill(std::span<const int32_t> prompt);
  // Runs the decode over `token` at `position` (< capacity) and returns its logits.
  std::span<const float> decode(int32_t token, int64_t position);

  struct Result {
    int64_t new_tokens = 0;
    double prefill_seconds = 0, decode_seconds = 0;
    bool stopped_at_eos = false;
  };
  // Prefill, then up to max_new tokens (at most capacity - prompt), stopping after `eos` when
  // given. out receives the new tokens (its capacity must hold them: nothing is allocated).
  Result generate(std::span<const int32_t> prompt, int64_t max_new, Sampler& sampler, std::optional<int32_t> eos,
                  std::vector<int32_t>& out);

 private:
  std::span<const float> read_logits();

  Executor& ex_;
  GenerateOps ops_;
  int64_t vocab_ = 0;
  std::vector<std::byte> raw_;  // the logits tensor's bytes (any float dtype)
  std::vector<float> logits_;
};

// What `memfit generate` reads besides the run flags.
struct GenerateRequest {
  std::string prompt;               // text, encoded with --tokenizer (or as bytes for a 256-token vocabulary)
  std::vector<int32_t> prompt_ids;  // --prompt-ids, used when not empty
  int64_t max_new_tokens = 32;
  SamplingOptions sampling;
  bool ignore_eos = false;
};

// The prompt's token ids: prompt_ids, else the text encoded by `tokenizer` (a tokenizer.json
// or its directory; empty: a 256-token vocabulary encodes bytes). Throws [cli] for an empty
// prompt, an id outside [0, vocab) or a text with no way to encode it.
std::vector<int32_t> prompt_tokens(const GenerateRequest& request, const std::string& tokenizer, int64_t vocab);
// eos_token_id of the model's config.json (the first of a list), when `model` is a path and
// it defines one.
std::optional<int32_t> model_eos_token(const std::string& model);

// train --sample-every: sets the policy's generate section (the sample prompt's length and a
// cache for it plus sample_tokens) so that the run's one plan counts it. Throws [train] in one
// line for what the section cannot read whole parameters from: ZeRO stage 3 (parameters live
// in gather buffers only inside a step), LoRA or a quantised base (the sample would skip the
// adapters or read codes), parameters offloaded off the device.
void plan_training_samples(const RunConfig& config, const ModelSpec& spec, Policy& policy);

// The samples of a training run: a Generator over the run's executor, greedy, its buffers and
// tokenizer made once.
class TrainingSampler {
 public:
  TrainingSampler(const RunConfig& config, Executor& ex, int64_t vocab);
  // The sample from the current weights: its text when it can be decoded, else its ids.
  std::string sample();

 private:
  Generator gen_;
  Sampler greedy_;
  std::vector<int32_t> prompt_, out_;
  int64_t tokens_ = 0, vocab_ = 0;
  std::optional<text::Tokenizer> tokenizer_;
};

// `memfit generate`: plans the inference program (prompt + max_new_tokens positions), loads
// config.load (else the seeded initialisation, as eval does), generates and logs the text,
// speeds and planned vs measured memory; returns the report (also to config.report_json).
nlohmann::json run_generate(const RunConfig& config, const GenerateRequest& request, std::ostream& log);

}  // namespace memfit
