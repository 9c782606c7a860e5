// What the same training step costs per rank under DeepSpeed 0.19 (`memfit plan --framework
// deepspeed`): the peak of live tensor bytes of one steady-state step of the HF model through
// deepspeed.initialize (engine(ids) -> engine.backward(loss) -> engine.step()), ZeRO stage 0-3,
// fp32, bf16 or fp16, on `world` data-parallel ranks, as torch's allocator counts it.
//
// The activations are HF's and PyTorch's (fit/framework_pytorch.hpp: the fp32 model, or the
// bf16 autocast one for a half-precision model); everything parameter-shaped is DeepSpeed's:
// the half-precision weights (whole, or a 1/N partition at stage 3 plus the parameters under
// stage3_param_persistence_threshold), the fp32 master partition and AdamW's moments (1/N from
// stage 1), the gradient partition, the reduce buckets of reduce_bucket_size elements (one, two
// with overlap_comm; taken at the first gradient of each backward at stages 1-2, at start-up
// at stage 3), and at stage 3 the parameters kept whole from their forward to their backward
// (stage3_max_reuse_distance, at most stage3_max_live_parameters). Closed forms from DeepSpeed's source
// (runtime/zero/stage_1_and_2.py, stage3.py, fp16/unfused_optimizer.py), checked against steps
// measured on DeepSpeed's CPU accelerator (tools/make_deepspeed_memory_fixtures.py).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "fit/framework_pytorch.hpp"
#include "graph/model_spec.hpp"
#include "graph/policy.hpp"

namespace memfit {

enum class DsPrecision : uint8_t { fp32, bf16, fp16 };
std::string_view ds_precision_name(DsPrecision p);

// zero_optimization's sizes, in elements, with DeepSpeed 0.19's defaults (runtime/zero/config.py).
struct DeepSpeedZero {
  int stage = 0;
  int64_t reduce_bucket_size = 500'000'000, allgather_bucket_size = 500'000'000;
  int64_t prefetch_bucket_size = 50'000'000, param_persistence_threshold = 100'000;
  int64_t max_live_parameters = 1'000'000'000, max_reuse_distance = 1'000'000'000;
  std::optional<bool> overlap_comm;  // unset: DeepSpeed's default, on at stage 3 only
  bool contiguous_gradients = true;
  bool overlap() const { return overlap_comm.value_or(stage == 3); }
};

struct DeepSpeedStep {
  TorchStep torch;  // micro-batch, sequence, attention, checkpointing (autocast_bf16: from precision)
  DsPrecision precision = DsPrecision::fp32;
  int world = 1;
  DeepSpeedZero zero;
  bool torch_adam = false;  // optimizer.params.torch_adam: torch's AdamW (foreach) instead of FusedAdam
};

// Reads what the prediction needs from a DeepSpeed config (zero_optimization, bf16/fp16,
// optimizer.params.torch_adam, train_micro_batch_size_per_gpu) into `step`; keys it does not
// know are left to DeepSpeed. Throws [framework] on values of the wrong type or range.
void apply_deepspeed_json(const nlohmann::json& config, DeepSpeedStep& step);

// Bytes live at the predicted peak of the largest rank, by what holds them.
struct DeepSpeedPeak {
  uint64_t parameters = 0;       // half-precision (or fp32) model weights this rank holds between uses
  uint64_t master = 0;           // the fp32 master partition (none at stage 0 in fp32)
  uint64_t optimizer_state = 0;  // AdamW's moments (and step counters) of this rank's partition
  uint64_t gradients = 0;        // gradient partition and whole gradients live at the peak
  uint64_t buckets = 0;          // reduce buckets (and stage 3's gathered parameters)
  uint64_t activations = 0;      // HF's saved and transient tensors, token ids (framework_pytorch); CUDA: + cuBLAS workspaces
  uint64_t peak = 0;
  std::string phase, where;
};

// The DeepSpeed step a memfit policy is: its stage, precision, micro-batch and world size,
// recomputation as activation checkpointing, flash as sdpa (or `attention`). Empty, with `why`,
// for what the prediction does not model: offload, 8-bit AdamW, LoRA or frozen parameters,
// selective recomputation, the update in backward.
std::optional<DeepSpeedStep> deepspeed_step_for(const Policy& p, int world, std::optional<TorchAttention> attention,
                                                std::string& why);

// Throws [framework] for shapes the prediction does not cover.
DeepSpeedPeak predict_deepspeed_peak(const ModelSpec& spec, const DeepSpeedStep& step);

std::string format_deepspeed_peak(const ModelSpec& spec, const DeepSpeedStep& step, const DeepSpeedPeak& p);
nlohmann::json deepspeed_peak_json(const DeepSpeedStep& step, const DeepSpeedPeak& p);

}  // namespace memfit
