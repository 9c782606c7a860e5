// What other tools would say for the same run, beside memfit's figures (`--compare`), and
// the chosen configuration as a DeepSpeed config (`--emit deepspeed FILE`).
//
// DeepSpeed's estimators (deepspeed.runtime.zero.stage_1_and_2 / stage3
// estimate_zero2/zero3_model_states_mem_needs, as DeepSpeed 0.19 has them) count model states
// only, with a 1.5 buffer factor on the host side, and assume 16-bit parameters with fp32 Adam:
// they leave out activations, temporaries and fragmentation. Stages 1 and 2 share the first
// (DeepSpeed has no stage-1 estimator); DeepSpeed without ZeRO has none. accelerate's `estimate-memory` counts weights,
// gradients and Adam state of one device ("Training using Adam": the largest of its stages).
// The formulas are re-derived from their documented behaviour, not copied.
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "fit/estimate.hpp"
#include "graph/model_spec.hpp"

namespace memfit {

struct HostDeviceBytes {
  uint64_t host = 0, device = 0;  // per rank (DeepSpeed: CPU per node / GPU per GPU)
};

// The counts DeepSpeed's estimators take for the HF model memfit's spec describes
// (model_to_params: every parameter once; the largest layer is the module with the most
// parameters of its own): the real vocabulary, not memfit's padded embedding rows.
struct DeepSpeedCounts {
  int64_t params = 0, largest_layer = 0;
};
DeepSpeedCounts deepspeed_counts(const ModelSpec& spec);

HostDeviceBytes deepspeed_zero2_estimate(int64_t params, int gpus_per_node, int nodes, bool cpu_offload,
                                         double buffer_factor = 1.5);
HostDeviceBytes deepspeed_zero3_estimate(int64_t params, int64_t largest_layer_params, int gpus_per_node, int nodes,
                                         bool cpu_offload, bool cpu_offload_params, bool zero_init = true,
                                         double buffer_factor = 1.5);
// accelerate estimate-memory's "Training using Adam" for a model of `params` fp32 parameters
// in the given training dtype (float32, or float16/bfloat16 mixed precision).
uint64_t accelerate_training_estimate(int64_t params, bool mixed_precision);

std::string format_comparison(const ModelSpec& spec, const ProgramSummary& s, const Policy& policy,
                              const Cluster& cluster, const RankEstimate& memfit);
nlohmann::json comparison_json(const ModelSpec& spec, const ProgramSummary& s, const Policy& policy,
                               const Cluster& cluster, const RankEstimate& memfit);

// The DeepSpeed config of a policy (keys memfit's own --config reader also understands), and
// one line of equivalent PyTorch FSDP settings. The config's "memfit_hf" key holds what the HF
// side of the run needs and DeepSpeed has no key for (hf_settings); DeepSpeed ignores it.
nlohmann::json deepspeed_config(const Policy& policy, double lr);
// {"training_arguments": {"gradient_checkpointing", "gradient_checkpointing_kwargs"},
//  "from_pretrained": {"attn_implementation"}}: the HF Trainer's arguments and the model's load
// argument the plan depends on (memfit's flash is sdpa, plain is eager; full recomputation is
// gradient checkpointing; selective has no HF form and leaves gradient_checkpointing out).
nlohmann::json hf_settings(const Policy& policy);
std::string fsdp_settings(const Policy& policy);

}  // namespace memfit
