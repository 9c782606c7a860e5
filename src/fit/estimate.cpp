#include "fit/estimate.hpp"

#include <algorithm>
#include <map>
#include <utility>

#include "core/bytes.hpp"
#include "core/error.hpp"
#include "fit/lora_breakdown.hpp"
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

}  // namespace

double roofline_seconds(double flops, double bytes, DType dt, const Hardware& hw, double efficiency) {
  // Only GEMM-like kinds reach tensor-core peak; elementwise kinds are bandwidth bound anyway.
  const double compute = flops / (hw.peak_flops(dt) * efficiency);
  const double memory = bytes / (hw.memory_bandwidth * kBandwidthEfficiency);
  return std::max(compute, memory);
}

double op_seconds(const Program& p, const Op& op, const Hardware& hw, double efficiency) {
  double bytes = 0;
  for (TensorId t : op.inputs)
    if (t != kNoTensor) bytes += double(p.tensor(t).bytes());
  for (TensorId t : op.outputs)
    if (t != kNoTensor) bytes += double(p.tensor(t).bytes());
  // An op runs at the speed of what it multiplies: its largest float input. 16-bit operands
  // reach tensor-core peak whatever the output (a bf16 product accumulating into fp32 gradients
  // is a bf16 GEMM), and small fp32 side inputs (flash attention's log-sum-exp, a norm's
  // statistics) do not make it an fp32 op. Ops without float inputs (fills) go by their output.
  DType dt = DType::f32;
  bool float_input = false;
  int64_t largest = -1;
  for (TensorId t : op.inputs) {
    if (t == kNoTensor || !dtype_is_float(p.tensor(t).dtype) || p.tensor(t).numel() <= largest) continue;
    dt = p.tensor(t).dtype;
    largest = p.tensor(t).numel();
    float_input = true;
  }
  // A quantised base's product multiplies dequantised tiles in the compute dtype (its scales
  // are fp32 inputs but never multiplied as a matrix).
  if (const auto* q = std::get_if<QuantLinearAttrs>(&op.attrs)) return roofline_seconds(op.flops, bytes, q->compute, hw, efficiency);
  if (!float_input)
    for (TensorId t : op.outputs)
      if (t != kNoTensor && dtype_is_float(p.tensor(t).dtype)) {
        dt = p.tensor(t).dtype;
        break;
      }
  return roofline_seconds(op.flops, bytes, dt, hw, efficiency);
}

Policy planning_policy(const Policy& policy) {
  Policy p = policy;
  p.zero_stage = 0;
  p.offload_optimizer = Tier::device;
  p.offload_params = Tier::device;
  p.sequence_parallel = false;  // the one-rank program has no tensor group to split rows over
  return p;
}

bool zero_from_program(const Policy& policy, int world) {
  if (policy.offload_optimizer != Tier::device || policy.offload_params != Tier::device) return false;
  const bool data_parallel = policy.zero_stage > 0 || world > 1;
  return !data_parallel || (policy.freeze.empty() && !policy.update_in_backward);
}

ProgramSummary summarize_program(const Program& program, const MemoryPlan& plan, const Hardware& hw,
                                 const EstimateOptions& options) {
  ProgramSummary s;
  const TierPlan& dev = plan.tier(Tier::device);
  s.ops = int(program.ops().size());
  s.live = dev.live_by_category;
  s.plan_peak = dev.peak_bytes;
  s.packing_overhead = dev.peak_bytes - dev.max_live_bytes;
  for (Tier t : kAllTiers) {
    s.tier_peak[size_t(t)] = plan.tier(t).peak_bytes;
    s.tier_at_peak[size_t(t)] = plan.tier(t).at_peak;
  }
  for (const CategoryBytes& live : s.live)
    for (size_t c = 0; c < live.size(); ++c) s.category_peak[c] = std::max(s.category_peak[c], live[c]);
  s.states = model_state_elements(program);
  s.parameters = program.parameter_count();
  s.phase.reserve(program.ops().size());
  s.op_name.reserve(program.ops().size());
  std::map<int, int64_t> per_layer;
  int64_t largest_single = 0;
  for (const ParamEntry& e : program.params()) {
    const TensorDesc& t = program.tensor(e.value != kNoTensor ? e.value : e.storage.front().id);  // quantised: codes
    if (e.value != kNoTensor) s.param_dtype = t.dtype;
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
    const int section = program.section_of_op(i);
    const SectionKind kind = section >= 0 ? program.sections()[size_t(section)].kind : SectionKind::micro;
    if (kind == SectionKind::eval) continue;  // validation: memory of the run, no part of its step
    const bool in_micro = kind == SectionKind::micro;
    // Collectives are timed by their ring volume over the links (estimate_from_summary), not
    // by the roofline; their waits cost no compute.
    if (is_collective_kind(op.kind) || op.kind == OpKind::wait) {
      (in_micro ? s.micro_comm_bytes : s.step_comm_bytes) += op.comm_bytes;
      // The tensor group is adjacent ranks inside a node: its rings run over the node's links.
      const auto* group = std::get_if<CollectiveAttrs>(&op.attrs);
      if (in_micro && group && group->group == CommGroup::tensor) s.micro_tensor_comm_bytes += op.comm_bytes;
      continue;
    }
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

namespace {

// `policy`: named when the program has LoRA or a quantised base, whose parts the summary lists.
ProgramSummary summarize_built(Program p, const Hardware& hw, const EstimateOptions& options,
                               const Policy* policy = nullptr) {
  if (options.prepare) options.prepare(p);
  const MemoryPlan plan = plan_memory(p, options.alignments);
  ProgramSummary s = summarize_program(p, plan, hw, options);
  if (policy && has_lora_or_quantised_base(*policy)) s.lora = lora_breakdown(p, *policy);
  return s;
}

}  // namespace

ProgramSummary plan_summary(const ModelSpec& spec, const Policy& policy, const Hardware& hw,
                            const EstimateOptions& options) {
  ProgramSummary s = summarize_built(
      build_training_program(spec, planning_policy(policy), Topology{}, hw.capabilities), hw, options, &policy);
  return s;
}

ProgramSummary plan_rank_summary(const ModelSpec& spec, const Policy& policy, int world, const Hardware& hw,
                                 const EstimateOptions& options, const ProgramSummary& unsharded, int tensor) {
  MEMFIT_CHECK(tensor >= 1 && world % tensor == 0, "fit", "--tensor-parallel {} does not divide --world-size {}", tensor,
               world);
  MEMFIT_CHECK(zero_from_program(policy, world), "fit",
               "the training program cannot express this policy on {} ranks (offload, or frozen parameters or the "
               "update in backward with ZeRO)",
               world);
  ProgramSummary s =
      world == 1 && policy.zero_stage == 0
          ? unsharded
          : summarize_built(build_training_program(spec, policy, Topology{world / tensor, tensor, 0}, hw.capabilities), hw,
                            options);
  // The rank's tensors are shards and bucket views; ZeRO divides the unsharded states.
  s.states = unsharded.states;
  s.zero_from_program = true;
  s.zero_stage = policy.zero_stage;
  s.world = world;
  s.tensor = tensor;
  return s;
}

ProgramSummary plan_run_summary(const ModelSpec& spec, const Policy& policy, int world, const Hardware& hw,
                                const EstimateOptions& options, int tensor) {
  ProgramSummary unsharded = plan_summary(spec, policy, hw, options);
  if (!zero_from_program(policy, world) && tensor == 1) return unsharded;
  return plan_rank_summary(spec, policy, world, hw, options, unsharded, tensor);
}

namespace {

// The memory of a rank program, as planned: nothing is modelled.
void program_memory(const ProgramSummary& s, RankEstimate& e) {
  e.from_program = true;
  e.states = shard_model_states(s.states, 0, 1);  // unsharded bytes in `full`
  e.states.device = {};
  for (Category c : {Category::parameters, Category::gradients, Category::master_weights, Category::optimizer_state})
    e.states.device[size_t(c)] = s.category_peak[size_t(c)];
  uint64_t best = 0;
  for (size_t i = 0; i < s.live.size(); ++i) {
    uint64_t total = 0;
    for (uint64_t v : s.live[i]) total += v;
    if (total > best || e.peak_op < 0) {
      best = total;
      e.peak_op = int(i);
    }
  }
  if (e.peak_op >= 0) e.by_tier[size_t(Tier::device)] = s.live[size_t(e.peak_op)];
  e.by_tier[size_t(Tier::host)] = s.tier_at_peak[size_t(Tier::host)];
  e.by_tier[size_t(Tier::disk)] = s.tier_at_peak[size_t(Tier::disk)];
  e.host_bytes = s.tier_peak[size_t(Tier::host)];
  e.disk_bytes = s.tier_peak[size_t(Tier::disk)];
  e.packing_overhead = s.packing_overhead;  // this program's own packing
  e.device_bytes = s.plan_peak + e.fixed_overhead;
}

// ZeRO and offload applied to the unsharded program's categories (fit/model_states.hpp).
void analytic_memory(const ProgramSummary& s, const Policy& policy, int W, RankEstimate& e) {
  const int stage = policy.zero_stage;
  e.from_program = stage == 0 && W == 1 && policy.offload_optimizer == Tier::device &&
                   policy.offload_params == Tier::device;
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
  auto scaled = [&](size_t i, int c) {
    const uint64_t v = s.live[i][size_t(c)];
    if (!is_model_state(Category(c)) || e.states.full[size_t(c)] == 0) return v;
    // Live model state scales with the rank's share of it (transient gradients included).
    return uint64_t(double(v) * double(e.states.device[size_t(c)]) / double(e.states.full[size_t(c)]) + 0.5);
  };
  uint64_t best = 0;
  for (size_t i = 0; i < s.live.size(); ++i) {
    uint64_t total = comm;
    for (int c = 0; c < kNumCategories; ++c) total += scaled(i, c);
    if (total > best || e.peak_op < 0) {
      best = total;
      e.peak_op = int(i);
    }
  }
  CategoryBytes& dev = e.by_tier[size_t(Tier::device)];
  if (e.peak_op >= 0) {
    for (int c = 0; c < kNumCategories; ++c) dev[size_t(c)] = scaled(size_t(e.peak_op), c);
    dev[size_t(Category::communication)] += comm;
  }
  for (int c = 0; c < kNumCategories; ++c) {
    e.by_tier[size_t(Tier::host)][size_t(c)] = e.states.host[size_t(c)];
    e.by_tier[size_t(Tier::disk)][size_t(c)] = e.states.disk[size_t(c)];
    e.host_bytes += e.states.host[size_t(c)];
    e.disk_bytes += e.states.disk[size_t(c)];
  }
  // No sharded or offloaded program was packed, and the unsharded plan's packing belongs to
  // other tensors at other offsets (issue 19: 7.97 GiB carried into the 70B winner, enough to
  // reorder families), so none is added: the labelled estimate is live bytes plus fixed ones.
  e.packing_overhead = 0;
  e.device_bytes = best + e.fixed_overhead;
}

// Communication of the analytic path: ring volumes of the collectives ZeRO would add.
double analytic_comm_bytes(int stage, int W, int k, double grad_bytes, double param_bytes) {
  if (W == 1) return 0;
  const double frac = double(W - 1) / double(W);
  if (stage <= 1) return 2 * frac * grad_bytes;                       // all-reduce once
  if (stage == 2) return k * frac * grad_bytes + frac * param_bytes;  // reduce-scatter per micro, all-gather
  return k * frac * (2 * param_bytes + grad_bytes);                   // gather fwd + bwd, reduce-scatter
}

void step_time(const ProgramSummary& s, const Policy& policy, const Cluster& cluster, const EstimateOptions& options,
               RankEstimate& e) {
  const Hardware& hw = cluster.hw;
  const int W = cluster.world_size(), stage = policy.zero_stage, k = policy.grad_accum;
  int64_t grad_elems = 0, param_elems = 0;
  for (const auto& [key, n] : s.states) {
    if (key.first == Category::gradients) grad_elems += n;
    if (key.first == Category::parameters) param_elems += n;
  }
  const double grad_bytes = double(dtype_bytes(s.grad_dtype, grad_elems));
  const double param_bytes = double(dtype_bytes(s.param_dtype, param_elems));
  // A rank program carries its collectives (and its optimizer already updates only its shard).
  e.comm_bytes = s.zero_from_program ? k * s.micro_comm_bytes + s.step_comm_bytes
                                     : analytic_comm_bytes(stage, W, k, grad_bytes, param_bytes);
  const double inside_node = s.zero_from_program ? k * s.micro_tensor_comm_bytes : 0;
  e.comm_seconds = (e.comm_bytes - inside_node) / cluster.collective_bandwidth() + inside_node / hw.intra_node_bandwidth;
  double optimizer_seconds = stage >= 1 && !s.zero_from_program ? s.optimizer_seconds / W : s.optimizer_seconds;
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
  // Each model replica (tensor group) reads its own rows; its ranks share them.
  const double tokens = double(policy.batch) * double(policy.seq) * k * (W / s.tensor);
  e.tokens_per_second = e.step_seconds > 0 ? tokens / e.step_seconds : 0;
  // Model FLOPs of all ranks (no recomputation) per second over the ranks' peak.
  const double model_flops = (k * s.micro_flops + s.optimizer_flops) * W;
  const double peak = hw.peak_flops(s.param_dtype == DType::f32 ? DType::f32 : DType::bf16) * W;
  e.model_flops_utilization = e.step_seconds > 0 ? model_flops / e.step_seconds / peak : 0;
}

}  // namespace

RankEstimate estimate_from_summary(const ProgramSummary& s, const Policy& policy, const Cluster& cluster,
                                   const EstimateOptions& options) {
  const int W = cluster.world_size();
  const int stage = policy.zero_stage;
  MEMFIT_CHECK(W >= 1, "hardware", "world size must be at least 1 (got {})", W);
  MEMFIT_CHECK(policy.offload_params == Tier::device || stage == 3, "policy",
               "offloading parameters needs ZeRO stage 3 (parameters are gathered layer by layer); got stage {}",
               stage);
  MEMFIT_CHECK(!s.zero_from_program || (s.zero_stage == stage && s.world == W && zero_from_program(policy, W)), "fit",
               "a rank program of stage {} on {} ranks cannot estimate stage {} on {} ranks", s.zero_stage, s.world,
               stage, W);
  RankEstimate e;
  e.fixed_overhead = cluster.fixed_overhead_bytes();
  if (s.zero_from_program) program_memory(s, e);
  else analytic_memory(s, policy, W, e);
  e.lora = s.lora;
  if (e.peak_op >= 0) {
    e.peak_op_name = s.op_name[size_t(e.peak_op)];
    e.peak_phase = s.phase[size_t(e.peak_op)];
  }
  step_time(s, policy, cluster, options, e);
  return e;
}

RankEstimate estimate_run(const ModelSpec& spec, const Policy& policy, const Cluster& cluster,
                          const EstimateOptions& options, int tensor) {
  return estimate_from_summary(plan_run_summary(spec, policy, cluster.world_size(), cluster.hw, options, tensor), policy,
                               cluster, options);
}

void plan_every_rank(const ModelSpec& spec, const Policy& policy, const Cluster& cluster, const EstimateOptions& options,
                     RankEstimate& e, int max_world, int tensor) {
  const int W = cluster.world_size();
  if (!e.from_program || W == 1 || W > max_world) return;
  e.ranks_planned = W;
  e.largest_rank = 0;
  e.largest_rank_device_bytes = e.device_bytes;
  for (int rank = 1; rank < W; ++rank) {
    Program p = build_training_program(spec, policy, Topology{W / tensor, tensor, rank}, cluster.hw.capabilities);
    if (options.prepare) options.prepare(p);
    const uint64_t bytes = plan_memory(p, options.alignments).tier(Tier::device).peak_bytes + e.fixed_overhead;
    if (bytes > e.largest_rank_device_bytes) {
      e.largest_rank_device_bytes = bytes;
      e.largest_rank = rank;
    }
  }
}

Overflow check_fit(const RankEstimate& e, const Cluster& cluster, uint64_t device_budget) {
  // Per tier: what the run needs and what there is. Host and disk are shared by a node's ranks.
  const uint64_t ranks = uint64_t(cluster.gpus_per_node);
  const std::pair<uint64_t, uint64_t> need_and_capacity[] = {
      {e.device_bytes_of_largest_rank(), device_budget},
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
