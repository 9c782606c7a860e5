#include "fit/framework_deepspeed.hpp"

#include <algorithm>
#include <cmath>
#include <vector>

#include <fmt/format.h>

#include "core/error.hpp"

namespace memfit {

std::string_view ds_precision_name(DsPrecision p) {
  return p == DsPrecision::fp32 ? "fp32" : p == DsPrecision::bf16 ? "bf16" : "fp16";
}

namespace {

int64_t count_of(const nlohmann::json& v, const std::string& key, int64_t lo) {
  // DeepSpeed writes sizes as 5e8 as often as 500000000.
  MEMFIT_CHECK(v.is_number(), "framework", "DeepSpeed config: {} must be a number (got {})", key, v.dump());
  const double d = v.get<double>();
  MEMFIT_CHECK(d >= double(lo) && d < 9.0e18 && d == double(int64_t(d)), "framework",
               "DeepSpeed config: {} must be a whole number of at least {} (got {})", key, lo, v.dump());
  return int64_t(d);
}

bool flag_of(const nlohmann::json& v, const std::string& key) {
  MEMFIT_CHECK(v.is_boolean(), "framework", "DeepSpeed config: {} must be true or false (got {})", key, v.dump());
  return v.get<bool>();
}

bool enabled(const nlohmann::json& config, const char* block) {
  const auto it = config.find(block);
  if (it == config.end() || !it->is_object()) return false;
  const auto e = it->find("enabled");
  return e != it->end() && !e->is_string() && flag_of(*e, std::string(block) + ".enabled");  // "auto": off
}

}  // namespace

void apply_deepspeed_json(const nlohmann::json& config, DeepSpeedStep& step) {
  MEMFIT_CHECK(config.is_object(), "framework", "a DeepSpeed config is a JSON object");
  const bool bf16 = enabled(config, "bf16") || enabled(config, "bfloat16"), fp16 = enabled(config, "fp16");
  MEMFIT_CHECK(!(bf16 && fp16), "framework", "DeepSpeed config enables both bf16 and fp16");
  step.precision = bf16 ? DsPrecision::bf16 : fp16 ? DsPrecision::fp16 : DsPrecision::fp32;
  if (const auto mb = config.find("train_micro_batch_size_per_gpu"); mb != config.end() && !mb->is_string())
    step.torch.batch = count_of(*mb, "train_micro_batch_size_per_gpu", 1);
  if (const auto opt = config.find("optimizer"); opt != config.end() && opt->is_object()) {
    const auto params = opt->find("params");
    if (params != opt->end() && params->contains("torch_adam"))
      step.torch_adam = flag_of(params->at("torch_adam"), "optimizer.params.torch_adam");
  }
  const auto zit = config.find("zero_optimization");
  if (zit == config.end()) return;
  MEMFIT_CHECK(zit->is_object(), "framework", "DeepSpeed config: zero_optimization must be an object");
  DeepSpeedZero& z = step.zero;
  for (const auto& [key, v] : zit->items()) {
    const std::string name = "zero_optimization." + key;
    if (v.is_string()) continue;  // "auto": the HF Trainer fills it in; DeepSpeed's default stands
    if (key == "stage") z.stage = int(count_of(v, name, 0));
    else if (key == "reduce_bucket_size") z.reduce_bucket_size = count_of(v, name, 1);
    else if (key == "allgather_bucket_size") z.allgather_bucket_size = count_of(v, name, 0);
    else if (key == "stage3_prefetch_bucket_size" || key == "prefetch_bucket_size")
      z.prefetch_bucket_size = count_of(v, name, 0);
    else if (key == "stage3_param_persistence_threshold" || key == "param_persistence_threshold")
      z.param_persistence_threshold = count_of(v, name, 0);
    else if (key == "stage3_max_live_parameters" || key == "max_live_parameters")
      z.max_live_parameters = count_of(v, name, 0);
    else if (key == "stage3_max_reuse_distance" || key == "max_reuse_distance")
      z.max_reuse_distance = count_of(v, name, 0);
    else if (key == "overlap_comm") z.overlap_comm = flag_of(v, name);
    else if (key == "contiguous_gradients") z.contiguous_gradients = flag_of(v, name);
    else if (key == "offload_optimizer" || key == "offload_param") {
      const auto dev = v.is_object() ? v.find("device") : v.end();
      MEMFIT_CHECK(!v.is_object() || dev == v.end() || *dev == "none", "framework",
                   "--framework deepspeed does not model {} (offload)", name);
    }
  }
  MEMFIT_CHECK(z.stage <= 3, "framework", "zero_optimization.stage must be 0-3 (got {})", z.stage);
}

std::optional<DeepSpeedStep> deepspeed_step_for(const Policy& p, int world, std::optional<TorchAttention> attention,
                                                std::string& why) {
  why.clear();
  const RecomputeMode r = p.recompute.mode;
  if (r != RecomputeMode::none && r != RecomputeMode::full) why = "recomputation other than none or full";
  else if (p.optimizer != OptimizerKind::adamw) why = "8-bit AdamW";
  else if (p.offload_optimizer != Tier::device || p.offload_params != Tier::device) why = "offload";
  else if (p.lora.rank != 0 || p.quantize_base.enabled() || !p.freeze.empty()) why = "LoRA or frozen parameters";
  else if (p.update_in_backward) why = "the update in backward";
  if (!why.empty()) return std::nullopt;
  DeepSpeedStep st;
  st.torch.batch = p.batch, st.torch.seq = p.seq;
  st.torch.attention = attention ? *attention
                       : p.attention == AttentionKind::flash ? TorchAttention::sdpa
                                                             : TorchAttention::eager;
  st.torch.checkpointing = r == RecomputeMode::full;
  st.precision = p.precision == Precision::bf16   ? DsPrecision::bf16
                 : p.precision == Precision::fp16 ? DsPrecision::fp16
                                                  : DsPrecision::fp32;
  st.world = world;
  st.zero.stage = p.zero_stage;
  return st;
}


namespace {

// HF's parameter tensors' sizes, as DeepSpeed's stage 3 sees them (the persistence threshold
// compares each tensor's numel).
std::vector<int64_t> parameter_tensors(const ModelSpec& s) {
  const int64_t C = s.n_embd, F = s.n_inner, V = s.vocab_size;
  std::vector<int64_t> t;
  if (s.arch == Arch::gpt2) {
    t = {V * C, s.max_seq * C};
    for (int64_t l = 0; l < s.n_layer; ++l)
      for (int64_t n : {C, C, 3 * C * C, 3 * C, C * C, C, C, C, C * F, F, F * C, C}) t.push_back(n);
    t.insert(t.end(), {C, C});
    return t;
  }
  const int64_t kv = s.n_kv_head * s.head_dim();
  t = {V * C};
  for (int64_t l = 0; l < s.n_layer; ++l) {
    for (int64_t n : {C * C, C * kv, C * kv, C * C, C * F, C * F, F * C, C, C}) t.push_back(n);
    if (s.qkv_bias) t.insert(t.end(), {C, kv, kv});
  }
  t.push_back(C);
  if (!s.tied_embeddings) t.push_back(V * C);
  return t;
}

// HF's activations at their largest, without PyTorch's parameter-shaped tensors (its gradients
// and autocast's weight copies), which are DeepSpeed's here: the token ids plus the largest
// forward or backward entry. A half-precision model is predicted by the bf16 autocast step: HF
// upcasts the logits to fp32 for the loss either way. On a CUDA device (TorchStep::cuda) the
// activations are CUDA's and the two threads' cuBLAS workspaces are counted with them.
uint64_t activations(const ModelSpec& spec, const DeepSpeedStep& st) {
  TorchStep t = st.torch;
  t.autocast_bf16 = st.precision != DsPrecision::fp32;
  const uint64_t workspaces = t.cuda ? 2 * t.cublas_workspace_bytes : 0;
  return uint64_t(8 * double(t.batch) * double(t.seq)) + pytorch_activation_peak(spec, t) + workspaces;
}

struct DsPhase {
  uint64_t gradients = 0, buckets = 0, activations = 0;
  const char* where = "";
};

}  // namespace

DeepSpeedPeak predict_deepspeed_peak(const ModelSpec& spec, const DeepSpeedStep& st) {
  const DeepSpeedZero& z = st.zero;
  MEMFIT_CHECK(st.world >= 1, "framework", "world size must be at least 1 (got {})", st.world);
  MEMFIT_CHECK(z.stage >= 0 && z.stage <= 3, "framework", "ZeRO stage must be 0-3 (got {})", z.stage);
  const std::vector<int64_t> tensors = parameter_tensors(spec);
  double P = 0;
  for (int64_t n : tensors) P += double(n);
  const double N = st.world, b = st.precision == DsPrecision::fp32 ? 4 : 2;
  const double VC = double(spec.vocab_size) * double(spec.n_embd);
  const double NV = double(st.torch.batch) * double(st.torch.seq) * double(spec.vocab_size);
  const double NI = double(st.torch.batch) * double(st.torch.seq) * double(spec.n_inner);
  const double R = double(z.reduce_bucket_size) * b * (z.overlap() ? 2 : 1);
  const double A = double(activations(spec, st));
  const double shard = std::ceil(P / N);  // DeepSpeed pads the flat group to a multiple of N

  DeepSpeedPeak out;
  DsPhase backward{0, 0, uint64_t(A), "backward, before the first gradient"};
  DsPhase after_hook;  // stages 1-2: the buckets are taken when the first gradient arrives
  DsPhase step;
  if (z.stage == 0) {
    // engine.py: fp32 runs torch's optimizer on the model's own parameters; bf16/fp16 wrap it
    // in FP16_(Unfused)Optimizer, which keeps fp32 copies of every parameter (fp16/*.py).
    out.parameters = uint64_t(b * P);
    out.master = b == 4 ? 0 : uint64_t(4 * P);
    out.optimizer_state = uint64_t(8 * P + 4 * double(tensors.size()));
    step.gradients = uint64_t(b * P + (b == 4 ? 0 : 4 * P));
    step.where = "optimizer step (gradients and their fp32 copies)";
  } else if (z.stage <= 2) {
    // stage_1_and_2.py: the bit16 groups flattened whole, the fp32 partition cloned from them
    // (single_partition_of_fp32_groups) and AdamW's moments of that partition only.
    out.parameters = uint64_t(b * P);
    out.master = uint64_t(4 * shard);
    out.optimizer_state = uint64_t(8 * shard + 4);
    // setup_buckets: the IPG buffers (reduce_bucket_size elements of the reduction dtype, two
    // with overlap_comm), taken at the first gradient hook; stage 2 also copies each reduced
    // gradient into grads_in_partition (copy_grads_in_partition).
    after_hook.buckets = uint64_t(z.contiguous_gradients ? R : 0);
    after_hook.gradients = uint64_t(b * VC + (z.stage == 2 ? b * shard : 0));
    // By then the loss's fp32 tensors (log-softmax, its gradient, nll's gradient) are freed.
    // The peak there is in the last block's MLP backward: the gradient of its N x I activation
    // and the activation function's backward output, in the model's dtype.
    after_hook.activations = uint64_t(std::max(0.0, A - 12 * NV) + 2 * b * NI);
    after_hook.where = "backward, at the first gradient (reduce buckets taken)";
    step.gradients = uint64_t((z.stage == 2 ? b * shard : 0) + 4 * shard);
    step.where = "optimizer step (fp32 gradient partition)";
  } else {
    // stage3.py: the bit16 partition (lp_param_buffer), parameters at or under the persistence
    // threshold whole on every rank, the fp32 partition, AdamW's moments, the IPG bucket and the
    // gradient partition (grad_partitions_flat_buffer), both taken at start-up.
    double persistent = 0;
    for (int64_t n : tensors)
      if (n <= z.param_persistence_threshold) persistent += double(n);
    out.parameters = uint64_t(b * shard + (N > 1 ? b * persistent * (1 - 1 / N) : 0));
    out.master = uint64_t(4 * shard);
    out.optimizer_state = uint64_t(8 * shard + 4);
    out.gradients = uint64_t(b * shard);
    out.buckets = uint64_t(z.contiguous_gradients ? double(z.reduce_bucket_size) * b : 0);
    // Gathered at the start of the backward. A parameter used again within
    // stage3_max_reuse_distance elements is not released after its forward
    // (partitioned_param_coordinator.py): with the defaults (1e9) every gathered parameter, up to
    // stage3_max_live_parameters, stays whole from its forward to its backward; otherwise about
    // one prefetch bucket and the largest tensor are. Every rank holds them whole.
    if (N > 1) {
      const double sharded = P - persistent, largest = double(*std::max_element(tensors.begin(), tensors.end()));
      const double live = z.max_reuse_distance >= int64_t(sharded)
                              ? sharded
                              : std::min(sharded, double(z.prefetch_bucket_size) + largest);
      backward.buckets = uint64_t(b * std::min(live, double(z.max_live_parameters) + largest));
    }
    step.gradients = uint64_t(4 * shard);
    step.where = "optimizer step (fp32 gradient partition)";
  }
  if (st.torch_adam) step.buckets = uint64_t(4 * (z.stage == 0 ? P : shard));  // foreach's temporary
  const uint64_t fixed = out.parameters + out.master + out.optimizer_state + out.gradients + out.buckets;
  const DsPhase* best = &backward;
  auto total = [&](const DsPhase& ph) { return fixed + ph.gradients + ph.buckets + ph.activations; };
  for (const DsPhase* ph : {&after_hook, &step})
    if (*ph->where && total(*ph) > total(*best)) best = ph;
  out.gradients += best->gradients;
  out.buckets += best->buckets;
  out.activations = best->activations;
  out.peak = total(*best);
  out.phase = best == &step ? "optimizer" : "backward";
  out.where = best->where;
  return out;
}

std::string format_deepspeed_peak(const ModelSpec& spec, const DeepSpeedStep& st, const DeepSpeedPeak& p) {
  const DeepSpeedZero& z = st.zero;
  std::string s = fmt::format(
      "DeepSpeed 0.19 ZeRO-{} + HF transformers (predicted, per rank of {}): model {}, batch {} x {}, attention {}, "
      "{}, {}\n  reduce_bucket_size {}, overlap_comm {}{}\n",
      z.stage, st.world, spec.name, st.torch.batch, st.torch.seq, torch_attention_name(st.torch.attention),
      ds_precision_name(st.precision), st.torch.checkpointing ? "activation checkpointing" : "no checkpointing",
      z.reduce_bucket_size, z.overlap(),
      z.stage == 3 ? fmt::format(", stage3_prefetch_bucket_size {}, stage3_param_persistence_threshold {}, "
                                 "stage3_max_live_parameters {}, stage3_max_reuse_distance {}",
                                 z.prefetch_bucket_size, z.param_persistence_threshold, z.max_live_parameters,
                                 z.max_reuse_distance)
                   : "");
  auto row = [&](std::string_view name, uint64_t bytes) {
    s += fmt::format("  {:<20} {:>14} B  {:>10.1f} MiB\n", name, bytes, double(bytes) / (1 << 20));
  };
  row("parameters", p.parameters);
  row("fp32 master", p.master);
  row("optimizer state", p.optimizer_state);
  row("gradients", p.gradients);
  row("buckets", p.buckets);
  row(st.torch.cuda ? "activations, cuBLAS" : "activations", p.activations);
  row("peak", p.peak);
  s += fmt::format("  peak in the {}; {} of a steady-state step, {}\n", p.where,
                   st.torch.cuda ? "torch.cuda.max_memory_allocated" : "torch tensor bytes",
                   st.torch_adam ? "torch AdamW (foreach)" : "FusedAdam");
  return s;
}

nlohmann::json deepspeed_peak_json(const DeepSpeedStep& st, const DeepSpeedPeak& p) {
  const DeepSpeedZero& z = st.zero;
  return {{"batch", st.torch.batch},
          {"seq", st.torch.seq},
          {"attention", torch_attention_name(st.torch.attention)},
          {"checkpointing", st.torch.checkpointing},
          {"precision", ds_precision_name(st.precision)},
          {"world_size", st.world},
          {"zero_optimization",
           {{"stage", z.stage},
            {"reduce_bucket_size", z.reduce_bucket_size},
            {"allgather_bucket_size", z.allgather_bucket_size},
            {"stage3_prefetch_bucket_size", z.prefetch_bucket_size},
            {"stage3_param_persistence_threshold", z.param_persistence_threshold},
            {"stage3_max_live_parameters", z.max_live_parameters},
            {"stage3_max_reuse_distance", z.max_reuse_distance},
            {"overlap_comm", z.overlap()},
            {"contiguous_gradients", z.contiguous_gradients}}},
          {"torch_adam", st.torch_adam},
          {"peak_bytes", p.peak},
          {"phase", p.phase},
          {"where", p.where},
          {"breakdown",
           {{"parameters", p.parameters},
            {"master", p.master},
            {"optimizer_state", p.optimizer_state},
            {"gradients", p.gradients},
            {"buckets", p.buckets},
            {"activations", p.activations}}}};
}

}  // namespace memfit
