#include "fit/compare.hpp"

#include <algorithm>

#include "core/bytes.hpp"
#include "core/error.hpp"

namespace memfit {

DeepSpeedCounts deepspeed_counts(const ModelSpec& spec) {
  const int64_t C = spec.n_embd, F = spec.n_inner, V = spec.vocab_size, HS = spec.head_dim();
  const int64_t padding = (spec.padded_vocab - spec.vocab_size) * C * (spec.tied_embeddings ? 1 : 2);
  DeepSpeedCounts d{spec.parameter_count() - padding, V * C};  // the token embedding (and an untied lm_head)
  auto module = [&](int64_t params) { d.largest_layer = std::max(d.largest_layer, params); };
  if (spec.arch == Arch::gpt2) {  // Conv1D modules hold weight and bias; wpe is a module of its own
    module(spec.max_seq * C);
    module(3 * C * C + 3 * C);
    module(C * F + F);
    module(F * C + C);
  } else {  // q, k, v, o, gate, up and down are modules of their own
    const int64_t bias = spec.qkv_bias ? 1 : 0;
    module(spec.n_head * HS * (C + bias));
    module(spec.n_kv_head * HS * (C + bias));
    module(F * C);
  }
  return d;
}

HostDeviceBytes deepspeed_zero2_estimate(int64_t params, int gpus_per_node, int nodes, bool cpu_offload,
                                         double factor) {
  const double P = double(params);
  const int gpus = gpus_per_node * nodes;
  HostDeviceBytes r;
  if (cpu_offload) {
    r.device = uint64_t(2 * P);
    r.host = uint64_t(P * std::max(4.0 * gpus, 16.0) * factor);
  } else {
    // 16-bit parameters whole; per GPU 18 bytes of the rest: 16-bit and fp32 gradients, fp32
    // parameters and Adam's two moments (DeepSpeed before 2024 counted 4 + 16 / N).
    r.device = uint64_t(2 * params + int64_t(18 * P / gpus));
    r.host = uint64_t(P * 4 * gpus_per_node * factor);
  }
  return r;
}

HostDeviceBytes deepspeed_zero3_estimate(int64_t params, int64_t largest_layer, int gpus_per_node, int nodes,
                                         bool cpu_offload, bool cpu_offload_params, bool zero_init, double factor) {
  const double P = double(params), gpus = double(gpus_per_node * nodes), per_node = 1.0 / nodes;
  const double largest = 4.0 * double(largest_layer);
  HostDeviceBytes r;
  if (cpu_offload && cpu_offload_params) {
    r.device = uint64_t(largest);
    r.host = uint64_t(P * (zero_init ? 18 * per_node : std::max(4.0 * gpus_per_node, 18 * per_node)) * factor);
  } else if (cpu_offload) {
    r.device = uint64_t(largest + double(int64_t(2 * P / gpus)));
    r.host = uint64_t(P * (zero_init ? 16 * per_node : std::max(4.0 * gpus_per_node, 16 * per_node)) * factor);
  } else {
    r.device = uint64_t(largest + double(int64_t(18 * P / gpus)));
    r.host = uint64_t((zero_init ? double(largest_layer) : P) * 4 * gpus_per_node * factor);
  }
  return r;
}

uint64_t accelerate_training_estimate(int64_t params, bool mixed_precision) {
  // Of the fp32 model size S: fp32 training peaks at 4 S (weights, gradients, two Adam
  // moments); mixed precision's largest stage is the optimizer's 2 S.
  const uint64_t S = uint64_t(params) * 4;
  return mixed_precision ? 2 * S : 4 * S;
}

namespace {

struct Row {
  std::string tool, what;
  uint64_t device, host;
};

std::vector<Row> rows(const ModelSpec& spec, const ProgramSummary& s, const Policy& p, const Cluster& c,
                      const RankEstimate& m) {
  const bool offload_opt = p.offload_optimizer != Tier::device, offload_params = p.offload_params != Tier::device;
  const DeepSpeedCounts ds = deepspeed_counts(spec);
  std::vector<Row> out;
  out.push_back({"memfit", "plan of the step program (model states, activations, temporaries, buffers)", m.device_bytes,
                 m.host_bytes});
  if (p.zero_stage == 3) {
    const auto d = deepspeed_zero3_estimate(ds.params, ds.largest_layer, c.gpus_per_node, c.nodes, offload_opt,
                                            offload_params);
    out.push_back({"deepspeed", "0.19 estimate_zero3_model_states_mem_needs (model states only, 1.5 host buffer factor)",
                   d.device, d.host});
  } else if (p.zero_stage >= 1) {
    const auto d = deepspeed_zero2_estimate(ds.params, c.gpus_per_node, c.nodes, offload_opt);
    out.push_back({"deepspeed",
                   p.zero_stage == 1 ? "0.19 estimate_zero2_model_states_mem_needs, its one estimator for stages 1 "
                                       "and 2 (model states only, 1.5 host buffer factor)"
                                     : "0.19 estimate_zero2_model_states_mem_needs (model states only, 1.5 host "
                                       "buffer factor)",
                   d.device, d.host});
  }
  out.push_back({"accelerate", "estimate-memory 'Training using Adam' (one device, weights + gradients + Adam)",
                 accelerate_training_estimate(ds.params, p.precision != Precision::fp32), 0});
  return out;
}

}  // namespace

std::string format_comparison(const ModelSpec& spec, const ProgramSummary& s, const Policy& p, const Cluster& c,
                              const RankEstimate& m) {
  std::string out = "compared with other estimators (device per rank; host: memfit per rank, DeepSpeed per node):\n";
  if (p.zero_stage == 0) out += "  (DeepSpeed has no estimator without ZeRO: no deepspeed row at --zero 0)\n";
  for (const Row& r : rows(spec, s, p, c, m))
    out += fmt::format("  {:<11}{:>12} device {:>12} host   {}\n", r.tool, format_bytes(r.device), format_bytes(r.host),
                       r.what);
  const CategoryBytes& d = m.by_tier[size_t(Tier::device)];
  out += fmt::format("  what the estimators leave out at memfit's peak: activations {}, temporaries {}, communication {}, "
                     "packing {}, runtime fixed {}\n",
                     format_bytes(d[size_t(Category::activations)]), format_bytes(d[size_t(Category::temporaries)]),
                     format_bytes(d[size_t(Category::communication)]), format_bytes(m.packing_overhead),
                     format_bytes(m.fixed_overhead));
  return out;
}

nlohmann::json comparison_json(const ModelSpec& spec, const ProgramSummary& s, const Policy& p, const Cluster& c,
                               const RankEstimate& m) {
  nlohmann::json j = nlohmann::json::array();
  for (const Row& r : rows(spec, s, p, c, m))
    j.push_back({{"tool", r.tool}, {"what", r.what}, {"device_bytes", r.device}, {"host_bytes", r.host}});
  return j;
}

nlohmann::json deepspeed_config(const Policy& p, double lr) {
  nlohmann::json j;
  j["train_micro_batch_size_per_gpu"] = p.batch;
  j["gradient_accumulation_steps"] = p.grad_accum;
  if (p.precision == Precision::bf16) j["bf16"] = {{"enabled", true}};
  if (p.precision == Precision::fp16) j["fp16"] = {{"enabled", true}};
  // Always under mixed precision: the reader's default gradient dtype is not every run's.
  if (p.precision != Precision::fp32) j["data_types"] = {{"grad_accum_dtype", dtype_name(p.grad_dtype)}};
  nlohmann::json zero = {{"stage", p.zero_stage}, {"overlap_comm", p.overlap_comm}};
  auto device = [](Tier t) { return t == Tier::host ? "cpu" : "nvme"; };
  if (p.offload_optimizer != Tier::device) zero["offload_optimizer"] = {{"device", device(p.offload_optimizer)}, {"pin_memory", true}};
  if (p.offload_params != Tier::device) zero["offload_param"] = {{"device", device(p.offload_params)}, {"pin_memory", true}};
  j["zero_optimization"] = zero;
  // DeepSpeed has no 8-bit AdamW of its own: the 8-bit run passes bitsandbytes' AdamW8bit as a
  // client optimizer; the type is kept so memfit's reader round-trips it.
  j["optimizer"] = {{"type", p.optimizer == OptimizerKind::adamw ? "AdamW" : "AdamW8bit"},
                    {"params",
                     {{"lr", lr},
                      {"betas", {p.adamw.beta1, p.adamw.beta2}},
                      {"eps", p.adamw.eps},
                      {"weight_decay", p.adamw.weight_decay}}}};
  if (p.grad_clip > 0) j["gradient_clipping"] = p.grad_clip;
  // DeepSpeed's section configures its checkpointing; the HF Trainer turns it on per block
  // (memfit_hf below). Only full recomputation has an HF form.
  if (p.recompute.mode == RecomputeMode::full)
    j["activation_checkpointing"] = {{"partition_activations", false}, {"cpu_checkpointing", false},
                                     {"contiguous_memory_optimization", false}, {"synchronize_checkpoint_boundary", false}};
  j["memfit_hf"] = hf_settings(p);
  // What the plan depends on and DeepSpeed has no key for (memfit's reader takes it back).
  nlohmann::json own = {{"seq", p.seq}, {"recompute", p.recompute.to_string()}, {"attention", attention_name(p.attention)}};
  if (!p.fp32_ops.empty()) own["fp32_ops"] = p.fp32_ops;
  if (!p.freeze.empty()) own["freeze"] = p.freeze;
  if (p.update_in_backward) own["optimizer_in_backward"] = true;
  if (p.classifier_chunk_rows > 0) own["classifier_chunk_rows"] = p.classifier_chunk_rows;
  j["memfit"] = own;
  return j;
}

nlohmann::json hf_settings(const Policy& p) {
  nlohmann::json args = nlohmann::json::object();
  // Selective recomputation has no HF switch: the key is left out rather than approximated.
  if (p.recompute.mode == RecomputeMode::none) args["gradient_checkpointing"] = false;
  if (p.recompute.mode == RecomputeMode::full) {
    args["gradient_checkpointing"] = true;
    args["gradient_checkpointing_kwargs"] = {{"use_reentrant", false}};  // what --framework pytorch predicts
  }
  // flash attention's memory (no T x T tensors) is what sdpa's fused kernels give.
  const char* attn = p.attention == AttentionKind::flash ? "sdpa" : "eager";
  return {{"training_arguments", args}, {"from_pretrained", {{"attn_implementation", attn}}}};
}

std::string fsdp_settings(const Policy& p) {
  const char* strategy = p.zero_stage == 0 ? "NO_SHARD" : p.zero_stage == 3 ? "FULL_SHARD" : "SHARD_GRAD_OP";
  std::string mp = p.precision == Precision::fp32
                       ? "None"
                       : fmt::format("MixedPrecision(param_dtype=torch.{0}, reduce_dtype=torch.{1}, buffer_dtype=torch.{0})",
                                     p.precision == Precision::bf16 ? "bfloat16" : "float16",
                                     p.grad_dtype == DType::f32 ? "float32" : (p.precision == Precision::bf16 ? "bfloat16" : "float16"));
  return fmt::format("FSDP(sharding_strategy=ShardingStrategy.{}, mixed_precision={}, cpu_offload=CPUOffload(offload_params={}), "
                     "activation checkpointing: {}, attention: {}{}",
                     strategy, mp, p.offload_params != Tier::device || p.offload_optimizer != Tier::device ? "True" : "False",
                     p.recompute.to_string(), p.attention == AttentionKind::flash ? "sdpa/flash" : "eager",
                     p.zero_stage == 1 ? " (FSDP has no stage 1: SHARD_GRAD_OP is the nearest, sharding gradients too)" : "");
}

}  // namespace memfit
