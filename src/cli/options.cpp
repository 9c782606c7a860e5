#include "dist/communicator.hpp"
#include "cli/options.hpp"

#include <omp.h>

#include <algorithm>
#include <charconv>

#include "core/bytes.hpp"
#include "core/error.hpp"

namespace memfit::cli {

template <typename T>
void RunOptions::add(CLI::App& app, const std::string& name, const std::string& help,
                     std::function<void(RunConfig&, T)> apply) {
  // A flag given twice takes its last value, so a suggested change can be appended to a command.
  app.add_option_function<T>(name, [this, apply](const T& v) { given_.push_back([apply, v](RunConfig& c) { apply(c, v); }); },
                             help)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
}

void RunOptions::add_flag(CLI::App& app, const std::string& name, const std::string& help,
                          std::function<void(RunConfig&, bool)> apply) {
  app.add_flag_function(name, [this, apply](int64_t) { given_.push_back([apply](RunConfig& c) { apply(c, true); }); },
                        help);
}

RunOptions::RunOptions(CLI::App& app, bool training) {
  app.add_option("--config", config_file_, "JSON config file (memfit keys and DeepSpeed keys); flags override it");
  add<std::string>(app, "--model",
                   "preset (gpt2-tiny, gpt2, gpt2-medium, gpt2-large, gpt2-xl, llama-tiny, llama-2-7b, llama-2-13b, "
                   "llama-2-70b, llama-3-8b, llama-3-70b, mistral-7b) or HF config.json path (gpt2, llama, mistral, "
                   "qwen2)",
                   [](RunConfig& c, std::string v) { c.model = v; });
  add<std::string>(app, "--backend", "cpu | reference (the naive kernels: slow, fp32, an oracle)",
                   [](RunConfig& c, std::string v) { c.backend = v; });
  add<int64_t>(app, "--batch", "micro-batch size B", [](RunConfig& c, int64_t v) { c.policy.batch = v; });
  app.add_option_function<std::string>(
      "--seq",
      [this](const std::string& v) {
        if (v == "auto") {
          seq_auto_ = true;
          return;
        }
        int64_t t = 0;
        const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), t);
        if (ec != std::errc() || end != v.data() + v.size()) throw CLI::ValidationError("--seq", "expected a number or auto");
        given_.push_back([t](RunConfig& c) { c.policy.seq = t; });
      },
      "sequence length T (max-batch: auto searches it too)")
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  add<int>(app, "--grad-accum", "micro-steps per optimizer step", [](RunConfig& c, int v) { c.policy.grad_accum = v; });
  add<std::string>(app, "--precision", "fp32 | bf16 | fp16",
                   [](RunConfig& c, std::string v) { c.policy.precision = parse_precision(v); });
  add<std::string>(app, "--grad-dtype", "parameter gradient dtype under bf16/fp16: fp32 (default) | bf16 | fp16",
                   [](RunConfig& c, std::string v) { c.policy.grad_dtype = parse_dtype(v); });
  add<std::string>(app, "--fp32-ops", "ops computed in fp32 under bf16/fp16: comma-separated op kinds, op names, or name prefixes ending in *",
                   [](RunConfig& c, std::string v) {
                     c.policy.fp32_ops.clear();
                     for (size_t at = 0; at <= v.size();) {
                       const size_t comma = std::min(v.find(',', at), v.size());
                       if (comma > at) c.policy.fp32_ops.push_back(v.substr(at, comma - at));
                       at = comma + 1;
                     }
                   });
  add<std::string>(app, "--freeze", "parameters to freeze (no gradient, master or optimizer state): comma-separated globs over HF names, e.g. h.*.attn.*,wte.weight",
                   [](RunConfig& c, std::string v) { c.policy.freeze = split_freeze_patterns(v); });
  add<std::string>(app, "--recompute", "none | full | every:K | selective[:ops] | auto",
                   [](RunConfig& c, std::string v) { c.policy.recompute = parse_recompute(v); });
  add<std::string>(app, "--attention", "plain | flash",
                   [](RunConfig& c, std::string v) { c.policy.attention = parse_attention(v); });
  add<std::string>(app, "--optimizer", "adamw | adamw8bit",
                   [](RunConfig& c, std::string v) { c.policy.optimizer = parse_optimizer(v); });
  add<int>(app, "--zero", "ZeRO stage 0..3 (data parallelism over the ranks of mpirun)",
           [](RunConfig& c, int v) { c.policy.zero_stage = v; });
  add<std::string>(app, "--overlap-comm", "on | off: run collectives asynchronously, overlapping compute (default on)",
                   [](RunConfig& c, std::string v) {
                     MEMFIT_CHECK(v == "on" || v == "off", "cli", "--overlap-comm takes on or off, not '{}'", v);
                     c.policy.overlap_comm = v == "on";
                   });
  add<std::string>(app, "--offload-optimizer", "device | host | disk",
                   [](RunConfig& c, std::string v) { c.policy.offload_optimizer = parse_tier(v); });
  add<std::string>(app, "--offload-params", "device | host | disk",
                   [](RunConfig& c, std::string v) { c.policy.offload_params = parse_tier(v); });
  add<float>(app, "--weight-decay", "AdamW weight decay (matrices and embeddings)",
             [](RunConfig& c, float v) { c.policy.adamw.weight_decay = v; });
  add<double>(app, "--beta1", "AdamW beta1", [](RunConfig& c, double v) { c.policy.adamw.beta1 = v; });
  add<double>(app, "--beta2", "AdamW beta2", [](RunConfig& c, double v) { c.policy.adamw.beta2 = v; });
  add<double>(app, "--adam-eps", "AdamW epsilon", [](RunConfig& c, double v) { c.policy.adamw.eps = v; });
  add<double>(app, "--grad-clip", "clip gradients to this global norm (0: off)",
              [](RunConfig& c, double v) { c.policy.grad_clip = v; });
  add_flag(app, "--optimizer-in-backward",
            "update each parameter as soon as the backward is done with it (no step-wide gradient buffer)",
            [](RunConfig& c, bool v) { c.policy.update_in_backward = v; });
  add<int64_t>(app, "--classifier-chunk", "rows of logits materialised at once (0: automatic)",
               [](RunConfig& c, int64_t v) { c.policy.classifier_chunk_rows = v; });
  add<int>(app, "--threads", "OpenMP threads for kernels (default: OMP_NUM_THREADS or all cores)",
           [](RunConfig&, int v) { omp_set_num_threads(v); });
  add<std::string>(app, "--memory-budget", "device memory budget, e.g. 16GiB (default: available RAM)",
                   [](RunConfig& c, std::string v) { c.memory_budget = parse_bytes(v); });
  add<double>(app, "--val-fraction", "share of the data held out for validation (0: none)",
              [](RunConfig& c, double v) { c.val_fraction = v; });
  if (!training) return;
  add<std::string>(app, "--data", "token file (llm.c .bin, nanoGPT .bin) or text file; default: built-in synthetic corpus",
                   [](RunConfig& c, std::string v) { c.data = v; });
  add<std::string>(app, "--data-format", "auto | llmc | nanogpt | text",
                   [](RunConfig& c, std::string v) { c.data_format = parse_token_format(v); });
  add<int64_t>(app, "--steps", "optimizer steps", [](RunConfig& c, int64_t v) { c.steps = v; });
  add<double>(app, "--lr", "learning rate", [](RunConfig& c, double v) { c.lr = v; });
  add<int64_t>(app, "--warmup", "linear warmup steps", [](RunConfig& c, int64_t v) { c.warmup_steps = v; });
  add<std::string>(app, "--lr-schedule", "constant | cosine (after the warmup)",
                   [](RunConfig& c, std::string v) { c.lr_schedule = parse_lr_schedule(v); });
  add<double>(app, "--min-lr", "cosine floor (default: lr / 10)", [](RunConfig& c, double v) { c.min_lr = v; });
  add<int64_t>(app, "--decay-steps", "cosine: step at which --min-lr is reached (default: --steps)",
               [](RunConfig& c, int64_t v) { c.decay_steps = v; });
  add<uint64_t>(app, "--seed", "seed of initialisation, synthetic data and shuffling",
                [](RunConfig& c, uint64_t v) { c.seed = v; });
  add_flag(app, "--shuffle", "read batches in a seeded random order", [](RunConfig& c, bool v) { c.shuffle = v; });
  add<int64_t>(app, "--eval-every", "validation loss every N steps (0: at the end only)",
               [](RunConfig& c, int64_t v) { c.eval_every = v; });
  add<int64_t>(app, "--eval-batches", "validation batches per evaluation", [](RunConfig& c, int64_t v) { c.eval_batches = v; });
  add<std::string>(app, "--load", "initial weights: .safetensors file or HF model directory",
                   [](RunConfig& c, std::string v) { c.load = v; });
  add<std::string>(app, "--save", "write weights: directory (model.safetensors + config.json) or .safetensors file",
                   [](RunConfig& c, std::string v) { c.save = v; });
  add<std::string>(app, "--checkpoint-dir", "write sharded training checkpoints here (one step-NNNNNN directory per save, `latest` names the newest)",
                   [](RunConfig& c, std::string v) { c.checkpoint_dir = v; });
  add<int64_t>(app, "--checkpoint-every", "steps between checkpoints (0: after the last step)",
               [](RunConfig& c, int64_t v) { c.checkpoint_every = v; });
  add<int>(app, "--keep-checkpoints", "complete checkpoints kept in --checkpoint-dir (default 2)",
           [](RunConfig& c, int v) { c.keep_checkpoints = v; });
  add<std::string>(app, "--resume",
                   "continue from a checkpoint directory: its newest valid checkpoint, or one step-NNNNNN directory "
                   "(same world size and ZeRO stage)",
                   [](RunConfig& c, std::string v) { c.resume = v; });
  add<double>(app, "--comm-timeout", "seconds a collective may wait for the other ranks before the job ends (0: no "
              "limit; default 300)",
              [](RunConfig& c, double v) {
                MEMFIT_CHECK(v >= 0, "cli", "--comm-timeout takes seconds >= 0, not {}", v);
                c.comm_timeout = v;
              });
  add<std::string>(app, "--report-json", "write the run report to this file",
                   [](RunConfig& c, std::string v) { c.report_json = v; });
  add<int64_t>(app, "--log-every", "progress line every N steps", [](RunConfig& c, int64_t v) { c.log_every = v; });
  add<std::string>(app, "--loss-scaler", "fp16 dynamic loss scaling: pytorch (GradScaler) | deepspeed",
                   [](RunConfig& c, std::string v) { c.loss_scale.convention = parse_loss_scale_convention(v); });
  add<double>(app, "--loss-scale", "fp16: a fixed loss scale (0: dynamic)",
              [](RunConfig& c, double v) { c.loss_scale.fixed_scale = v; });
  add<double>(app, "--initial-loss-scale", "fp16: the dynamic scale's start (default 65536)",
              [](RunConfig& c, double v) { c.loss_scale.initial_scale = v; });
  add<double>(app, "--min-loss-scale", "fp16: the dynamic scale's floor (default 1)",
              [](RunConfig& c, double v) { c.loss_scale.min_scale = v; });
}

RunConfig RunOptions::resolve() const {
  RunConfig c;
  // Under mpirun the world is the launcher's (DeepSpeed's train_batch_size counts it); `plan
  // --world-size` (cli/hardware_plan.cpp) sets it for planning.
  c.topology.data = launched_world_size();
  if (!config_file_.empty()) apply_config_file(config_file_, c);
  for (const auto& apply : given_) apply(c);
  return c;
}

}  // namespace memfit::cli
