#include "dist/communicator.hpp"
#include "cli/options.hpp"

#include <omp.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <limits>
#include <type_traits>

#include "core/bytes.hpp"
#include "core/error.hpp"
#include "io/safetensors_shards.hpp"
#include "train/adapter_files.hpp"
#include "train/deepspeed_config.hpp"

namespace memfit::cli {

namespace {

// The text of a numeric flag as a T, read strictly (run_config.hpp's rules): "2.5" is not an
// integer, an integer too large for T is refused rather than saturated, "nan" is not a number.
template <typename T>
T parse_flag_number(const std::string& name, const std::string& text) {
  if constexpr (std::is_floating_point_v<T>) {
    const double v = parse_real_text(name, text);
    MEMFIT_CHECK(std::fabs(v) <= double(std::numeric_limits<T>::max()), "cli", "{}: '{}' is out of range", name, text);
    return T(v);
  } else if constexpr (std::is_unsigned_v<T>) {
    const uint64_t v = parse_unsigned_text(name, text);
    MEMFIT_CHECK(v <= std::numeric_limits<T>::max(), "cli", "{}: '{}' is out of range", name, text);
    return T(v);
  } else {
    const int64_t v = parse_integer_text(name, text);
    MEMFIT_CHECK(v >= std::numeric_limits<T>::min() && v <= std::numeric_limits<T>::max(), "cli",
                 "{}: '{}' is out of range (an integer in [{}, {}])", name, text, std::numeric_limits<T>::min(),
                 std::numeric_limits<T>::max());
    return T(v);
  }
}

}  // namespace

template <typename T>
void RunOptions::add(CLI::App& app, const std::string& name, const std::string& help,
                     std::function<void(RunConfig&, T)> apply) {
  // A flag given twice takes its last value, so a suggested change can be appended to a command.
  if constexpr (std::is_arithmetic_v<T>) {
    // Numbers are read by memfit, not by CLI11 (which saturates out-of-range integers), when
    // the flags are resolved: a bad value is then a one-line [cli] error naming the flag.
    app.add_option_function<std::string>(
           name,
           [this, apply, name](const std::string& text) {
             given_.push_back([apply, name, text](RunConfig& c) { apply(c, parse_flag_number<T>(name, text)); });
           },
           help)
        ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  } else {
    app.add_option_function<T>(name, [this, apply](const T& v) { given_.push_back([apply, v](RunConfig& c) { apply(c, v); }); },
                               help)
        ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  }
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
  add<int64_t>(app, "--batch", "micro-batch size B",
               [](RunConfig& c, int64_t v) {
                 c.policy.batch = require_in("--batch", v, input_range::batch);
                 c.batch_flag = true;
               });
  app.add_option_function<std::string>(
      "--seq",
      [this](const std::string& v) {
        if (v == "auto") {
          seq_auto_ = true;
          return;
        }
        given_.push_back([v](RunConfig& c) {
          c.policy.seq = require_in("--seq", parse_integer_text("--seq", v), input_range::batch);
        });
      },
      "sequence length T (max-batch: auto searches it too)")
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  add<int64_t>(app, "--grad-accum", "micro-steps per optimizer step", [](RunConfig& c, int64_t v) {
    c.policy.grad_accum = int(require_in("--grad-accum", v, input_range::accumulation));
    c.grad_accum_flag = true;
  });
  add<std::string>(app, "--precision", "fp32 | bf16 | fp16 (default fp32; bf16 with --quantize-base, as QLoRA)",
                   [](RunConfig& c, std::string v) {
                     c.policy.precision = parse_precision(v);
                     c.precision_given = true;
                   });
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
  add_fine_tuning_options(app);
  add<std::string>(app, "--recompute", "none | full | every:K | selective[:ops] | auto",
                   [](RunConfig& c, std::string v) { c.policy.recompute = parse_recompute(v); });
  add<std::string>(app, "--attention", "plain | flash (default plain; flash with --quantize-base)",
                   [](RunConfig& c, std::string v) {
                     c.policy.attention = parse_attention(v);
                     c.attention_given = true;
                   });
  add<std::string>(app, "--optimizer", "adamw | adamw8bit",
                   [](RunConfig& c, std::string v) { c.policy.optimizer = parse_optimizer(v); });
  add<int64_t>(app, "--zero", "ZeRO stage 0..3 (data parallelism over the ranks of mpirun)",
               [](RunConfig& c, int64_t v) {
                 c.policy.zero_stage = int(require_in("--zero", v, input_range::zero_stage));
               });
  add<std::string>(app, "--overlap-comm", "on | off: run collectives asynchronously, overlapping compute (default on)",
                   [](RunConfig& c, std::string v) {
                     MEMFIT_CHECK(v == "on" || v == "off", "cli", "--overlap-comm takes on or off, not '{}'", v);
                     c.policy.overlap_comm = v == "on";
                   });
  add_zero_plus_plus_options(app);
  add<std::string>(app, "--offload-optimizer", "device | host | disk",
                   [](RunConfig& c, std::string v) { c.policy.offload_optimizer = parse_tier(v); });
  add<std::string>(app, "--offload-params", "device | host | disk",
                   [](RunConfig& c, std::string v) { c.policy.offload_params = parse_tier(v); });
  add<std::string>(app, "--offload-dir", "directory of the disk tier's files (one per rank) for disk offload",
                   [](RunConfig& c, std::string v) { c.offload_dir = std::move(v); });
  add<int64_t>(app, "--offload-chunk-elements",
               "elements per staging chunk of optimizer offload (a multiple of 4096; default 4194304)",
               [](RunConfig& c, int64_t v) {
                 c.policy.offload_chunk_elements = require_in("--offload-chunk-elements", v, input_range::offload_chunk);
               });
  add<double>(app, "--weight-decay", "AdamW weight decay (matrices and embeddings)", [](RunConfig& c, double v) {
    c.policy.adamw.weight_decay = float(require_in("--weight-decay", v, input_range::weight_decay));
  });
  add<double>(app, "--beta1", "AdamW beta1", [](RunConfig& c, double v) {
    c.policy.adamw.beta1 = require_in("--beta1", v, input_range::beta);
  });
  add<double>(app, "--beta2", "AdamW beta2", [](RunConfig& c, double v) {
    c.policy.adamw.beta2 = require_in("--beta2", v, input_range::beta);
  });
  add<double>(app, "--adam-eps", "AdamW epsilon", [](RunConfig& c, double v) {
    c.policy.adamw.eps = require_in("--adam-eps", v, input_range::non_negative);
  });
  add<double>(app, "--grad-clip", "clip gradients to this global norm (0: off)",
              [](RunConfig& c, double v) {
                c.policy.grad_clip = require_in("--grad-clip", v, input_range::non_negative);
              });
  add_flag(app, "--optimizer-in-backward",
            "update each parameter as soon as the backward is done with it (no step-wide gradient buffer)",
            [](RunConfig& c, bool v) { c.policy.update_in_backward = v; });
  add<int64_t>(app, "--classifier-chunk", "rows of logits materialised at once (0: automatic)",
               [](RunConfig& c, int64_t v) {
                 c.policy.classifier_chunk_rows = require_in("--classifier-chunk", v, input_range::chunk_rows);
               });
  add<int64_t>(app, "--threads", "OpenMP threads for kernels (default: OMP_NUM_THREADS or all cores)",
               [](RunConfig&, int64_t v) {
                 omp_set_num_threads(int(require_in("--threads", v, input_range::threads)));
               });
  add<std::string>(app, "--memory-budget", "device memory budget, e.g. 16GiB (default: available RAM)",
                   [](RunConfig& c, std::string v) { c.memory_budget = parse_memory_bytes(v, "--memory-budget"); });
  add<double>(app, "--val-fraction", "share of the data held out for validation (0: none)",
              [](RunConfig& c, double v) {
                c.val_fraction = require_in("--val-fraction", v, input_range::fraction);
              });
  // Planning commands take it too: the adapter's LoRA settings are part of the run's plan.
  add<std::string>(app, "--load-adapter", "a PEFT adapter directory: its LoRA settings (and, when training, its weights)",
                   [](RunConfig& c, std::string v) { c.load_adapter = v; });
  if (training) add_training_options(app);
}

// LoRA and the quantised base (graph/lora.hpp, graph/quantize_base.hpp).
// ZeRO++ and the node layout its communication is reported against.
void RunOptions::add_zero_plus_plus_options(CLI::App& app) {
  add_flag(app, "--zero-quantized-weights",
           "ZeRO++ qwZ at --zero 3: parameters all-gathered as int8 blocks of 256 with fp32 scales",
           [](RunConfig& c, bool v) { c.policy.zero_quantized_weights = v; });
  add_flag(app, "--zero-quantized-gradients",
           "ZeRO++ qgZ at --zero 2 or 3: gradients reduce-scattered as int4 (or int8) blocks of 256 with fp32 scales "
           "through an all-to-all inside each node, then one across nodes",
           [](RunConfig& c, bool v) { c.policy.zero_quantized_gradients = v; });
  add<int64_t>(app, "--zero-quantized-gradient-bits", "qgZ's code width: 4 (default, as DeepSpeed) or 8",
               [](RunConfig& c, int64_t v) { c.policy.zero_quantized_gradient_bits = int(v); });
  add<int64_t>(app, "--zero-hpz-partition-size",
               "ZeRO++ hpZ at --zero 3: a secondary copy of the parameters partitioned over N consecutive ranks, "
               "so the backward's gathers stay among them (1, or the data-parallel degree: off)",
               [](RunConfig& c, int64_t v) {
                 c.policy.zero_hpz_partition_size = int(require_in("--zero-hpz-partition-size", v, input_range::ranks_per_node));
               });
  add<int64_t>(app, "--tensor-parallel",
               "tensor parallelism (Megatron-LM): each group of T adjacent ranks splits every block's heads, MLP and "
               "vocabulary; data parallelism (and ZeRO) runs over world / T groups",
               [](RunConfig& c, int64_t v) { c.topology.tensor = int(require_in("--tensor-parallel", v, input_range::ranks_per_node)); });
  add_flag(app, "--sequence-parallel",
           "with --tensor-parallel: the norms and residual stream hold 1/T of the rows on each tensor rank (gathered "
           "before each block's products, reduce-scattered after them)",
           [](RunConfig& c, bool v) { c.policy.sequence_parallel = v; });
  add<int64_t>(app, "--ranks-per-node", "consecutive ranks per node, for the intra/inter-node split of the bytes sent "
               "(default: the ranks sharing a node when running, the world for a plan)",
               [](RunConfig& c, int64_t v) { c.ranks_per_node = int(require_in("--ranks-per-node", v, input_range::ranks_per_node)); });
}

void RunOptions::add_fine_tuning_options(CLI::App& app) {
  add<int64_t>(app, "--lora-rank", "LoRA: adapters of this rank on the target layers, every base weight frozen",
               [](RunConfig& c, int64_t v) { c.policy.lora.rank = require_in("--lora-rank", v, input_range::lora_rank); });
  add<double>(app, "--lora-alpha", "LoRA: the adapters' output is scaled by alpha / rank (default 8, as PEFT)",
              [](RunConfig& c, double v) { c.policy.lora.alpha = require_in("--lora-alpha", v, input_range::positive); });
  add<double>(app, "--lora-dropout", "LoRA: dropout on the adapters' input (default 0)",
              [](RunConfig& c, double v) { c.policy.lora.dropout = require_in("--lora-dropout", v, input_range::fraction); });
  add<std::string>(app, "--lora-targets",
                   "LoRA: comma-separated module names (q_proj,v_proj; c_attn) or all-linear (default: PEFT's for the model)",
                   [](RunConfig& c, std::string v) {
                     c.policy.lora.targets = split_freeze_patterns(v);
                     c.policy.lora.target_regex.clear();
                   });
  add<std::string>(app, "--lora-bias", "LoRA: which biases train: none | all | lora_only (as PEFT)",
                   [](RunConfig& c, std::string v) { c.policy.lora.bias = parse_lora_bias(v); });
  add<std::string>(app, "--lora-init", "LoRA: the adapters' first values, as PEFT's init_lora_weights: true (A "
                   "Kaiming-uniform, B zero; default) | gaussian (A normal, std 1/rank) | false (B drawn too) | olora "
                   "(W's QR) | pissa (W's top singular vectors) | pissa_niter_N (N power iterations); olora and pissa "
                   "leave W - scale B A in the base",
                   [](RunConfig& c, std::string v) {
                     MEMFIT_CHECK(parse_lora_init(v, c.policy.lora), "cli",
                                  "--lora-init '{}': expected true, gaussian, false, olora, pissa or pissa_niter_N", v);
                   });
  add_flag(app, "--lora-dora",
           "LoRA: DoRA, a trained magnitude per output rescaling each adapted weight's columns (PEFT's use_dora)",
           [](RunConfig& c, bool v) { c.policy.lora.dora = v; });
  add_flag(app, "--lora-rslora", "LoRA: scale the adapters' output by alpha / sqrt(rank) (PEFT's use_rslora)",
           [](RunConfig& c, bool v) { c.policy.lora.rslora = v; });
  add<std::string>(app, "--lora-exclude-modules", "LoRA: comma-separated module names never targeted (PEFT's "
                   "exclude_modules)",
                   [](RunConfig& c, std::string v) {
                     c.policy.lora.exclude_modules = split_freeze_patterns(v);
                     c.policy.lora.exclude_regex.clear();
                   });
  add<std::string>(app, "--lora-layers", "LoRA: comma-separated layer indices whose modules are targeted (PEFT's "
                   "layers_to_transform; default every layer)",
                   [](RunConfig& c, std::string v) {
                     c.policy.lora.layers_to_transform.clear();
                     for (const std::string& x : split_freeze_patterns(v))
                       c.policy.lora.layers_to_transform.push_back(parse_integer_text("--lora-layers", x));
                   });
  add<std::string>(app, "--lora-modules-to-save",
                   "LoRA: comma-separated modules trained whole beside the adapters and saved with them, as PEFT's "
                   "modules_to_save (lm_head, embed_tokens, norm)",
                   [](RunConfig& c, std::string v) { c.policy.lora.modules_to_save = split_freeze_patterns(v); });
  add<std::string>(app, "--quantize-base", "store the frozen base weights quantised: nf4 | fp4 | int8 | none (QLoRA)",
                   [](RunConfig& c, std::string v) { c.policy.quantize_base.kind = parse_base_quant(v); });
  add_flag(app, "--double-quant", "quantise the 4-bit weights' absmax again (bitsandbytes' compress_statistics)",
           [](RunConfig& c, bool v) { c.policy.quantize_base.double_quant = v; });
  add<int64_t>(app, "--quant-block", "elements per quantisation block (a power of two in [32, 4096]; default 64)",
               [](RunConfig& c, int64_t v) { c.policy.quantize_base.block = require_quant_block("--quant-block", v); });
}

// Flags of `train` and `profile` only: data, schedule, checkpoints, loss scaling.
void RunOptions::add_training_options(CLI::App& app) {
  add<std::string>(app, "--data", "token file (llm.c .bin, nanoGPT .bin) or text file; default: built-in synthetic corpus",
                   [](RunConfig& c, std::string v) { c.data = v; });
  add<std::string>(app, "--data-format", "auto | llmc | nanogpt | text",
                   [](RunConfig& c, std::string v) { c.data_format = parse_token_format(v); });
  add<std::string>(app, "--tokenizer",
                   "HF tokenizer.json or its directory: --data is text, tokenised once into a cache next to it",
                   [](RunConfig& c, std::string v) { c.tokenizer = v; });
  add<int64_t>(app, "--steps", "optimizer steps",
               [](RunConfig& c, int64_t v) { c.steps = require_in("--steps", v, input_range::steps); });
  add<double>(app, "--lr", "learning rate",
              [](RunConfig& c, double v) { c.lr = require_in("--lr", v, input_range::non_negative); });
  add<int64_t>(app, "--warmup", "linear warmup steps", [](RunConfig& c, int64_t v) {
    c.warmup_steps = require_in("--warmup", v, input_range::interval);
  });
  add<std::string>(app, "--lr-schedule", "constant | cosine (after the warmup)",
                   [](RunConfig& c, std::string v) { c.lr_schedule = parse_lr_schedule(v); });
  add<double>(app, "--min-lr", "cosine floor (default: lr / 10)", [](RunConfig& c, double v) {
    c.min_lr = require_in("--min-lr", v, input_range::non_negative);
  });
  add<int64_t>(app, "--decay-steps", "cosine: step at which --min-lr is reached (default: --steps)",
               [](RunConfig& c, int64_t v) { c.decay_steps = require_in("--decay-steps", v, input_range::interval); });
  add<uint64_t>(app, "--seed", "seed of initialisation, synthetic data and shuffling",
                [](RunConfig& c, uint64_t v) { c.seed = v; });
  add_flag(app, "--shuffle", "read batches in a seeded random order", [](RunConfig& c, bool v) { c.shuffle = v; });
  add<int64_t>(app, "--eval-every", "validation loss every N steps (0: at the end only)",
               [](RunConfig& c, int64_t v) { c.eval_every = require_in("--eval-every", v, input_range::interval); });
  add<int64_t>(app, "--sample-every", "print a greedy sample from the current weights every N steps (0: off); "
               "its KV cache and activations are planned with the run",
               [](RunConfig& c, int64_t v) { c.sample_every = require_in("--sample-every", v, input_range::interval); });
  add<std::string>(app, "--sample-prompt", "the samples' prompt (--tokenizer, or bytes for a 256-token vocabulary; "
                   "default: token id 0)", [](RunConfig& c, std::string v) { c.sample_prompt = std::move(v); });
  add<int64_t>(app, "--sample-tokens", "new tokens per sample (default 32)",
               [](RunConfig& c, int64_t v) { c.sample_tokens = require_in("--sample-tokens", v, input_range::steps); });
  add<int64_t>(app, "--eval-batches", "validation batches per evaluation", [](RunConfig& c, int64_t v) {
    c.eval_batches = require_in("--eval-batches", v, input_range::steps);
  });
  add<std::string>(app, "--load", "initial weights: .safetensors file or HF model directory",
                   [](RunConfig& c, std::string v) { c.load = v; });
  add<std::string>(app, "--save", "write weights: directory (model.safetensors + config.json) or .safetensors file; "
                   "a LoRA run writes a PEFT adapter directory (adapter_config.json + adapter_model.safetensors)",
                   [](RunConfig& c, std::string v) { c.save = v; });
  add<std::string>(app, "--max-shard-size", "a --save directory holds shards of at most this size, as transformers "
                   "writes them (default 5GB; units KB, MB, GB, KiB, MiB, GiB)",
                   [](RunConfig& c, std::string v) { c.max_shard_bytes = parse_shard_size(v); });
  add<std::string>(app, "--checkpoint-dir", "write sharded training checkpoints here (one step-NNNNNN directory per save, `latest` names the newest)",
                   [](RunConfig& c, std::string v) { c.checkpoint_dir = v; });
  add<int64_t>(app, "--checkpoint-every", "steps between checkpoints (0: after the last step)",
               [](RunConfig& c, int64_t v) {
                 c.checkpoint_every = require_in("--checkpoint-every", v, input_range::interval);
               });
  add<int64_t>(app, "--keep-checkpoints", "complete checkpoints kept in --checkpoint-dir (default 2)",
               [](RunConfig& c, int64_t v) {
                 c.keep_checkpoints = int(require_in("--keep-checkpoints", v, input_range::kept_checkpoints));
               });
  add<std::string>(app, "--resume",
                   "continue from a checkpoint directory: its newest valid checkpoint, or one step-NNNNNN directory "
                   "(any world size, ZeRO stage and offload; the same rows per step: --batch x ranks x --grad-accum)",
                   [](RunConfig& c, std::string v) { c.resume = v; });
  add<double>(app, "--comm-timeout", "seconds a collective may wait for the other ranks before the job ends (0: no "
              "limit; default 300)",
              [](RunConfig& c, double v) {
                c.comm_timeout = require_in("--comm-timeout", v, input_range::comm_timeout);
              });
  add<std::string>(app, "--report-json", "write the run report to this file",
                   [](RunConfig& c, std::string v) { c.report_json = v; });
  add<int64_t>(app, "--log-every", "progress line every N steps", [](RunConfig& c, int64_t v) {
    c.log_every = require_in("--log-every", v, input_range::interval);
  });
  add<std::string>(app, "--loss-scaler", "fp16 dynamic loss scaling: pytorch (GradScaler) | deepspeed",
                   [](RunConfig& c, std::string v) { c.loss_scale.convention = parse_loss_scale_convention(v); });
  add<double>(app, "--loss-scale", "fp16: a fixed loss scale (0: dynamic)",
              [](RunConfig& c, double v) {
                c.loss_scale.fixed_scale = require_in("--loss-scale", v, input_range::non_negative);
              });
  add<double>(app, "--initial-loss-scale", "fp16: the dynamic scale's start (default 65536)",
              [](RunConfig& c, double v) {
                c.loss_scale.initial_scale = require_in("--initial-loss-scale", v, input_range::initial_scale);
              });
  add<double>(app, "--min-loss-scale", "fp16: the dynamic scale's floor (default 1)",
              [](RunConfig& c, double v) {
                c.loss_scale.min_scale = require_in("--min-loss-scale", v, input_range::positive);
              });
}

RunConfig RunOptions::resolve() const {
  RunConfig c;
  // Under mpirun the world is the launcher's (DeepSpeed's train_batch_size counts it); `plan
  // --world-size` (cli/hardware_plan.cpp) sets it for planning.
  c.topology.data = launched_world_size();
  if (!config_file_.empty()) apply_config_file(config_file_, c);
  for (const auto& apply : given_) apply(c);
  // Tensor parallelism takes its degree out of the launched world: data = world / tensor (a
  // plan's --world-size does the same in cli/main.cpp).
  if (c.topology.data > 1) {
    MEMFIT_CHECK(c.topology.data % c.topology.tensor == 0, "train",
                 "--tensor-parallel {} does not divide the {} ranks launched", c.topology.tensor, c.topology.data);
    c.topology.data /= c.topology.tensor;
  }
  resolve_batch_keys(c, c.topology.data, c.config_note);
  // Every command plans the adapter's LoRA (rank, alpha, targets, bias) as a run would: `plan
  // --load-adapter DIR` must size the run that `train --load-adapter DIR` executes.
  if (!c.load_adapter.empty()) apply_adapter_config(c.load_adapter, c.policy.lora);
  apply_quantised_base_defaults(c);
  // A pissa_niter_N start drawn now is drawn from this run's seed (and recorded with the adapter).
  LoraPolicy& lora = c.policy.lora;
  if (lora.init == LoraInit::pissa && lora.pissa_niter >= 0 && lora.start_seed < 0)
    lora.start_seed = int64_t(c.seed);
  return c;
}

}  // namespace memfit::cli
