// RunConfig: everything a `memfit train` or `memfit plan` run is told, from flags and from a
// JSON config file. The config file accepts memfit's own keys and the DeepSpeed keys that
// mean the same thing; keys this build cannot honour yet are refused by name rather than
// ignored.
#pragma once

#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json_fwd.hpp>

#include "core/checked.hpp"
#include "graph/model_spec.hpp"
#include "graph/policy.hpp"
#include "io/token_file.hpp"
#include "train/loss_scaler.hpp"
#include "train/lr_schedule.hpp"

namespace memfit {

struct RunConfig {
  std::string model = "gpt2-tiny";  // preset name or path of an HF config.json
  std::string backend = "cpu";      // kernels/backend.hpp make_backend: cpu | reference
  Policy policy;
  Topology topology;

  std::string data;  // token file or text file; empty: the built-in synthetic corpus
  TokenFormat data_format = TokenFormat::automatic;
  std::string tokenizer;  // an HF tokenizer.json (or its directory): --data is text, tokenised once (train/token_cache)
  int64_t steps = 50;
  double lr = 1e-3;
  int64_t warmup_steps = 0;  // linear warmup from 0 to lr
  LrScheduleKind lr_schedule = LrScheduleKind::constant;
  double min_lr = -1;        // cosine floor; < 0: lr / 10
  int64_t decay_steps = 0;   // cosine: the step the floor is reached; 0: the last step
  // DeepSpeed's scheduler block (train/deepspeed_config.hpp): its start, shape and floor.
  double warmup_min_lr = 0, warmup_min_ratio = 0, cos_min_ratio = 0;
  bool linear_warmup = false;
  // DeepSpeed's batch keys as the config file gave them; resolve_batch_keys() settles them
  // against the flags and the data-parallel degree once the world is known.
  struct BatchKeys {
    std::optional<int64_t> global, micro, accum;
  } file_batch;
  bool batch_flag = false, grad_accum_flag = false;  // --batch / --grad-accum given
  // --precision / --attention or their config keys were given: a quantised base keeps them
  // (apply_quantised_base_defaults).
  bool precision_given = false, attention_given = false;
  std::string config_note;  // what the flags replaced in the config file (the run log prints it)
  std::string deepspeed_note;  // DeepSpeed keys that are read but bound nothing here (the run log prints it)
  // zero_optimization's bounds in elements (0: not given), checked against the program's buckets.
  struct ZeroBounds {
    int64_t reduce_bucket = 0, allgather_bucket = 0, prefetch_bucket = 0, max_live_parameters = 0, sub_group = 0;
  } zero_bounds;
  // The offload blocks' keys (issue 16 runs them); nvme_path is the disk tier's directory.
  struct OffloadKeys {
    std::string nvme_path;
    bool pin_memory = false;
    int64_t buffer_count = 0, buffer_size = 0, max_in_cpu = 0;
  } offload_optimizer_keys, offload_param_keys;
  std::string offload_dir;  // --offload-dir (or the offload blocks' nvme_path): the disk tier's files
  // DeepSpeed's aio block: the disk tier's request size in bytes and requests in flight.
  struct DiskIoKeys {
    uint64_t block_size = 1 << 20;
    int queue_depth = 8;
  } disk_io;
  uint64_t seed = 1337;
  bool shuffle = false;
  double val_fraction = 0.1;  // share of the data held out at its end; 0: no validation
  int64_t eval_every = 0;     // 0: validate after the last step only
  int64_t eval_batches = 4;
  // --sample-every N: every N steps rank 0 prints a greedy sample of sample_tokens new tokens
  // after sample_prompt (train/generate.hpp); its generate section is part of the run's plan.
  int64_t sample_every = 0;
  std::string sample_prompt;  // empty: token id 0
  int64_t sample_tokens = 32;
  std::string load;  // safetensors file or a directory holding model.safetensors
  std::string save;  // directory (model.safetensors + config.json) or a .safetensors path; LoRA: a PEFT adapter dir
  std::string load_adapter;  // a PEFT adapter directory (train/adapter_files.hpp) onto a LoRA run
  uint64_t max_shard_bytes = 5'000'000'000;  // --max-shard-size: a directory save above it is sharded
  std::string report_json;
  std::string checkpoint_dir;    // sharded training checkpoints (train/checkpoint.hpp) go here
  int64_t checkpoint_every = 0;  // steps between checkpoints; 0: only after the last step (when a dir is set)
  std::string resume;            // a checkpoint root (its newest valid one) or one step directory to continue from
  int keep_checkpoints = 2;      // complete checkpoints kept in checkpoint_dir (older ones removed after a save)
  uint64_t memory_budget = 0;  // bytes; 0: the memory available on this machine
  LossScaleConfig loss_scale;  // fp16 runs (DeepSpeed's fp16 block selects its convention)
  int64_t log_every = 1;
  // Consecutive world ranks per node, for the communication volume's intra/inter-node split
  // (graph/zero.hpp); 0: the ranks that share this rank's node (MPI_Comm_split_type), or the
  // whole world for a plan.
  int ranks_per_node = 0;
  double comm_timeout = 300;  // seconds a collective may wait for the other ranks; 0: no limit
};

ModelSpec resolve_model(const std::string& model);  // throws [model] / [config]

// --- Input rules, shared by flags (cli/options.cpp), memfit's config keys and DeepSpeed's ---
// Every numeric input is checked where it is read, against the same range whichever way it
// came, and refused in one line naming the field as the user wrote it: "--steps" ([cli]) or
// "train_iters" ([config]). Integers must be written as integers: 1.9, 2.0 and 1e5 are all
// refused for an integer field (a JSON 2.0 is a float, and PyTorch's DataLoader refuses a float
// batch size too). Reals must be finite.
inline constexpr int64_t kMaxSteps = 100'000'000;  // ~100x the longest published pretraining runs (~10^6 steps)
inline constexpr int kMaxThreads = 4096;           // above the hardware threads of any single machine

struct IntRange {
  int64_t lo, hi;
};
struct RealRange {
  double lo, hi;
  bool lo_open = false, hi_open = false;  // (lo, ... / ..., hi)
};
std::string describe(IntRange r);   // "an integer in [1, 100]"
std::string describe(RealRange r);  // "a number >= 0 and < 1"
namespace input_range {
inline constexpr IntRange steps{1, kMaxSteps};            // steps, eval batches, loss-scale window
inline constexpr IntRange interval{0, kMaxSteps};         // warmup, decay, eval/log/checkpoint every N (0: off)
inline constexpr IntRange batch{1, kMaxKernelDim};        // batch and sequence length (rows bounded by policy)
inline constexpr IntRange chunk_rows{0, kMaxKernelDim};   // classifier chunk rows (0: automatic)
inline constexpr IntRange offload_chunk{0, int64_t(1) << 40};  // optimizer offload's staging chunk (0: default)
inline constexpr IntRange accumulation{1, INT32_MAX};
inline constexpr IntRange lora_rank{1, kMaxKernelDim};    // checked against each target's shape by graph/lora
inline constexpr IntRange quant_block{32, 4096};          // and a power of two (bitsandbytes' block sizes)
inline constexpr IntRange zero_stage{0, 3};
inline constexpr IntRange threads{1, kMaxThreads};
inline constexpr IntRange hysteresis{1, INT32_MAX};
inline constexpr IntRange kept_checkpoints{1, 1'000'000};
inline constexpr double kInf = std::numeric_limits<double>::infinity();
inline constexpr RealRange non_negative{0, kInf, false, true};  // lr, min lr, eps, weight decay, clipping
inline constexpr RealRange beta{0, 1, false, true};              // AdamW betas: 0 <= beta < 1 (PyTorch's check)
inline constexpr RealRange fraction{0, 1, false, true};          // the validation share
inline constexpr RealRange positive{0, kInf, true, true};        // the minimum loss scale, LoRA alpha
inline constexpr RealRange initial_scale{0, 0x1p100, true, false};
inline constexpr RealRange comm_timeout{0, 1e7};
inline constexpr IntRange ranks_per_node{1, 1 << 20};  // seconds (0: no limit); 1e7 s is 116 days
inline constexpr RealRange weight_decay{0, std::numeric_limits<float>::max()};  // stored as float
}  // namespace input_range

// Range checks of a value already read; throw [cli] or [config] naming `field`.
int64_t require_in(std::string_view field, int64_t v, IntRange r);
double require_in(std::string_view field, double v, RealRange r);
// Text of a flag, read strictly: an integer is an optional '-' and decimal digits that fit
// int64_t (uint64_t for the unsigned form); a real is decimal or scientific notation, finite.
int64_t parse_integer_text(std::string_view field, std::string_view text);
uint64_t parse_unsigned_text(std::string_view field, std::string_view text);
double parse_real_text(std::string_view field, std::string_view text);

// The learning-rate schedule of a run, defaults resolved and validated (throws [train]).
LrSchedule lr_schedule_of(const RunConfig& config);

// Freeze patterns from "h.*.attn.*,wte.weight" (--freeze, or the config key as one string).
std::vector<std::string> split_freeze_patterns(const std::string& text);
// QLoRA's defaults where the run did not choose: a quantised base computes in bf16
// (bitsandbytes' compute dtype) with flash attention (the CPU has no bf16 plain attention for
// grouped-query heads, and flash keeps no T x T tensor).
void apply_quantised_base_defaults(RunConfig& c);
// A quantisation block size, range-checked and a power of two; throws [cli]/[config] naming `field`.
int64_t require_quant_block(std::string_view field, int64_t block);

// Applies a JSON config file on top of `config` (flags given on the command line are
// applied after it by the CLI). Throws [config] on malformed files and unknown keys.
void apply_config_file(const std::string& path, RunConfig& config);
// PEFT's LoraConfig (config key "lora", a PEFT adapter_config.json) onto config.policy.lora.
// `weights_from_file`: the keys come with an adapter's weights (--load-adapter), so an
// initialisation other than PEFT's default is no concern unless it changed the base weights.
void apply_lora_config(const nlohmann::json& j, RunConfig& config, bool weights_from_file = false);

}  // namespace memfit
