#include "fit/estimate.hpp"

#include <algorithm>
#include <map>
#include <utility>

#include "core/bytes.hpp"
#include "core/error.hpp"
#include "graph/training_program.hpp"

namespace memfit {

namespace {

// DeepSpeed's default reduce_bucket_size (elements): ZeRO-2/3 reduce gradients through a
// bucket of this many elements (or the whole gradient when smaller).
constexpr int64_t kReduceBucketElements = 500'000'000;
constexpr double kBandwidthEfficiency = 0.8;  // share of datasheet memory bandwidth streaming ops reach

bool is_model_state(Category c) {
  return c == Category::parameters || c == Category::gradients || c == Category::master_weights ||
         c == Category::optimizer_state;
}

double op_seconds(const Program& p, const Op& op, const Hardware& hw, double efficiency) {
  double bytes = 0;
  for (TensorId t : op.inputs)
    if (t != kNoTensor) bytes += double(p.tensor(t).bytes());
  for (TensorId t : op.outputs)
    if (t != kNoTensor) bytes += double(p.tensor(t).bytes());
  DType dt = DType::f32;
  for (TensorId t : op.outputs)
    if (t != kNoTensor && dtype_is_float(p.tensor(t).dtype)) {
      dt = p.tensor(t).dtype;
      break;
    }
  // Only GEMM-like kinds reach tensor-core peak; elementwise kinds are bandwidth bound anyway.
  const double compute = op.flops / (hw.peak_flops(dt) * efficiency);
  const double memory = bytes / (hw.memory_bandwidth * kBandwidthEfficiency);
  return std::max(compute, memory);
}

}  // namespace

Policy planning_policy(const Policy& policy) {
  Policy p = policy;
  p.zero_stage = 0;
  p.offload_optimizer = Tier::device;
  p.offload_params = Tier::device;
  p.with_eval = false;
  return p;
}

ProgramSummary summarize_program(const Program& program, const MemoryPlan& plan, const Hardware& hw,
                                 const EstimateOptions& options) {
  ProgramSummary s;
  const TierPlan& dev = plan.tier(Tier::device);
  s.ops = int(program.ops().size());
  s.live = dev.live_by_category;
  s.plan_peak = dev.peak_bytes;
  s.packing_overhead = dev.peak_bytes - dev.max_live_bytes;
  s.states = model_state_elements(program);
  s.parameters = program.parameter_count();
  s.phase.reserve(program.ops().size());
  s.op_name.reserve(program.ops().size());
  std::map<int, int64_t> per_layer;
  int64_t largest_single = 0;
  for (const ParamEntry& e : program.params()) {
    const TensorDesc& t = program.tensor(e.value);
    s.param_dtype = t.dtype;
    s.largest_tensor_parameters = std::max(s.largest_tensor_parameters, t.numel());
    if (e.grad != kNoTensor) s.grad_dtype = program.tensor(e.grad).dtype;
    if (t.layer >= 0) per_layer[t.layer] += t.numel();
    else largest_single = std::max(largest_single, t.numel());
  }
  s.largest_layer_parameters = largest_single;
  for (const auto& [layer, n] : per_layer) s.largest_layer_parameters = std::max(s.largest_layer_parameters, n);
  const Section* opt = program.find_section(SectionKind::optimizer);
  for (int i = 0; i < s.ops; ++i) {
    const Op& op = program.op(i);
    s.phase.push_back(op.phase);
    s.op_name.push_back(op.name);
    const double t = op_seconds(program, op, hw, options.efficiency);
    if (opt && i >= opt->begin && i < opt->end) {
      s.optimizer_flops += op.flops;
      s.optimizer_seconds += t;
      for (TensorId id : op.outputs)
        if (id != kNoTensor) s.optimizer_bytes += 2.0 * double(program.tensor(id).bytes());
      for (TensorId id : op.inputs)
        if (id != kNoTensor) s.optimizer_bytes += double(program.tensor(id).bytes());
    } else if (op.phase == Phase::recompute) {
      s.recompute_flops += op.flops;
      s.recompute_seconds += t;
    } else {
      s.micro_flops += op.flops;
      s.micro_seconds += t;
    }
  }
  return s;
}

ProgramSummary plan_summary(const ModelSpec& spec, const Policy& policy, const Hardware& hw,
                            const EstimateOptions& options) {
  Program p = build_training_program(spec, planning_policy(policy), Topology{}, hw.capabilities);
  if (options.prepare) options.prepare(p);
  const MemoryPlan plan = plan_memory(p);
  return summarize_program(p, plan, hw, options);
}

RankEstimate estimate_from_summary(const ProgramSummary& s, const Policy& policy, const Cluster& cluster,
                                   const EstimateOptions& options) {
  const int W = cluster.world_size();
  const int stage = policy.zero_stage;
  MEMFIT_CHECK(W >= 1, "hardware", "world size must be at least 1 (got {})", W);
  MEMFIT_CHECK(policy.offload_params == Tier::device || stage == 3, "policy",
               "offloading parameters needs ZeRO stage 3 (parameters are gathered layer by layer); got stage {}",
               stage);
  const Hardware& hw = cluster.hw;
  RankEstimate e;
  e.states = shard_model_states(s.states, stage, W, policy.offload_optimizer, policy.offload_params);
  // Collective working buffers of the sharded stages.
  int64_t grad_elems = 0;
  for (const auto& [key, n] : s.states)
    if (key.first == Category::gradients) grad_elems += n;
  uint64_t comm = 0;
  // (Also on one rank when the gradients or parameters stream to and from the host.)
  const bool grads_stream = W > 1 || policy.offload_optimizer != Tier::device;
  const bool params_stream = W > 1 || policy.offload_params != Tier::device;
  if (stage >= 2 && grads_stream) comm += dtype_bytes(s.grad_dtype, std::min(grad_elems, kReduceBucketElements));
  if (stage == 3 && params_stream) comm += 2 * dtype_bytes(s.param_dtype, s.largest_layer_parameters);  // current + prefetched

  uint64_t best = 0;
  for (size_t i = 0; i < s.live.size(); ++i) {
    uint64_t total = comm;
    for (int c = 0; c < kNumCategories; ++c) {
      const uint64_t v = s.live[i][size_t(c)];
      if (is_model_state(Category(c)) && e.states.full[size_t(c)] > 0) {
        // Live model state scales with the rank's share of it (transient gradients included).
        const double share = double(e.states.device[size_t(c)]) / double(e.states.full[size_t(c)]);
        total += uint64_t(double(v) * share + 0.5);
      } else {
        total += v;
      }
    }
    if (total > best || e.peak_op < 0) {
      best = total;
      e.peak_op = int(i);
    }
  }
  CategoryBytes& dev = e.by_tier[size_t(Tier::device)];
  if (e.peak_op >= 0) {
    for (int c = 0; c < kNumCategories; ++c) {
      const uint64_t v = s.live[size_t(e.peak_op)][size_t(c)];
      dev[size_t(c)] = is_model_state(Category(c)) && e.states.full[size_t(c)] > 0
                           ? uint64_t(double(v) * double(e.states.device[size_t(c)]) / double(e.states.full[size_t(c)]) + 0.5)
                           : v;
    }
    dev[size_t(Category::communication)] += comm;
    e.peak_op_name = s.op_name[size_t(e.peak_op)];
    e.peak_phase = s.phase[size_t(e.peak_op)];
  }
  for (int c = 0; c < kNumCategories; ++c) {
    e.by_tier[size_t(Tier::host)][size_t(c)] = e.states.host[size_t(c)];
    e.by_tier[size_t(Tier::disk)][size_t(c)] = e.states.disk[size_t(c)];
    e.host_bytes += e.states.host[size_t(c)];
    e.disk_bytes += e.states.disk[size_t(c)];
  }
  e.packing_overhead = s.packing_overhead;
  e.fixed_overhead = cluster.fixed_overhead_bytes();
  e.device_bytes = best + s.packing_overhead + e.fixed_overhead;

  // --- time per optimizer step ---
  const int k = policy.grad_accum;
  const double frac = double(W - 1) / double(W);
  const double grad_bytes = double(dtype_bytes(s.grad_dtype, grad_elems));
  int64_t param_elems = 0;
  for (const auto& [key, n] : s.states)
    if (key.first == Category::parameters) param_elems += n;
  const double param_bytes = double(dtype_bytes(s.param_dtype, param_elems));
  double comm_bytes = 0;
  if (W > 1) {
    if (stage <= 1) comm_bytes = 2 * frac * grad_bytes;                                   // all-reduce once
    else if (stage == 2) comm_bytes = k * frac * grad_bytes + frac * param_bytes;         // reduce-scatter per micro, all-gather
    else comm_bytes = k * frac * (2 * param_bytes + grad_bytes);                          // gather fwd + bwd, reduce-scatter
  }
  e.comm_bytes = comm_bytes;
  e.comm_seconds = comm_bytes / cluster.collective_bandwidth();
  double optimizer_seconds = stage >= 1 ? s.optimizer_seconds / W : s.optimizer_seconds;
  double offload_bytes = 0, offload_seconds = 0;
  if (policy.offload_optimizer != Tier::device) {
    // Gradients down, updated 16-bit parameters up; the update runs on the host's cores,
    // shared by the node's ranks.
    const double shard = stage >= 1 ? 1.0 / W : 1.0;
    offload_bytes += (grad_bytes + param_bytes) * shard;
    offload_seconds += (grad_bytes + param_bytes) * shard / hw.host_link_bandwidth;
    const double host_bw = hw.host_memory_bandwidth / cluster.gpus_per_node;
    optimizer_seconds = s.optimizer_bytes * shard / host_bw;
    if (policy.offload_optimizer == Tier::disk) {
      const double state = double(e.states.disk[size_t(Category::optimizer_state)] + e.states.disk[size_t(Category::master_weights)]);
      offload_bytes += 2 * state;
      offload_seconds += 2 * state / (hw.disk_bandwidth / cluster.gpus_per_node);
    }
  }
  if (policy.offload_params != Tier::device) {
    // Each micro-step fetches this rank's parameter shard for forward and again for backward.
    const double bytes = 2.0 * k * param_bytes / W;
    offload_bytes += bytes;
    offload_seconds += policy.offload_params == Tier::host ? bytes / hw.host_link_bandwidth
                                                            : bytes / (hw.disk_bandwidth / cluster.gpus_per_node);
  }
  e.offload_bytes = offload_bytes;
  e.offload_seconds = offload_seconds;
  e.compute_seconds = k * s.micro_seconds + optimizer_seconds;
  e.recompute_seconds = k * s.recompute_seconds;
  e.step_seconds = e.compute_seconds + e.recompute_seconds + e.comm_seconds * (1 - options.comm_overlap) + offload_seconds;
  const double tokens = double(policy.batch) * double(policy.seq) * k * W;
  e.tokens_per_second = e.step_seconds > 0 ? tokens / e.step_seconds : 0;
  // Model FLOPs (no recomputation) per second over the ranks' peak.
  const double model_flops = (k * s.micro_flops + s.optimizer_flops) * W;
  const double peak = hw.peak_flops(s.param_dtype == DType::f32 ? DType::f32 : DType::bf16) * W;
  e.model_flops_utilization = e.step_seconds > 0 ? model_flops / e.step_seconds / peak : 0;
  return e;
}

RankEstimate estimate_run(const ModelSpec& spec, const Policy& policy, const Cluster& cluster,
                          const EstimateOptions& options) {
  return estimate_from_summary(plan_summary(spec, policy, cluster.hw, options), policy, cluster, options);
}

Overflow check_fit(const RankEstimate& e, const Cluster& cluster, uint64_t device_budget) {
  // Per tier: what the run needs and what there is. Host and disk are shared by a node's ranks.
  const uint64_t ranks = uint64_t(cluster.gpus_per_node);
  const std::pair<uint64_t, uint64_t> need_and_capacity[] = {
      {e.device_bytes, device_budget},
      {e.host_bytes * ranks, cluster.hw.host_memory_bytes},
      {e.disk_bytes * ranks, cluster.hw.disk_bytes}};
  Overflow o;
  for (Tier t : {Tier::device, Tier::host, Tier::disk}) {
    const auto [need, capacity] = need_and_capacity[size_t(t)];
    if (need <= capacity) continue;
    const CategoryBytes& b = e.by_tier[size_t(t)];
    o.tier = t;
    o.category = Category(std::max_element(b.begin(), b.end()) - b.begin());
    o.excess = need - capacity;
    return o;
  }
  return o;
}

}  // namespace memfit
