// How a RankEstimate is shown: a table per rank (tiers x categories, the op at the peak, the
// step-time split) and the same numbers as JSON.
#include "core/bytes.hpp"
#include "core/error.hpp"
#include "fit/estimate.hpp"

namespace memfit {

namespace {

// What LoRA and a quantised base put in the categories above (unsharded bytes).
std::string format_lora(const LoraBreakdown& l) {
  std::string out = "  LoRA / quantised base, as planned in the program:\n";
  if (l.quantized_tensors > 0)
    out += fmt::format("    frozen base   {:>12} quantised ({}: {} tensors, {} elements), {:>10} kept in its dtype\n",
                       format_bytes(l.quantized_bytes), l.quant, l.quantized_tensors, l.quantized_elements,
                       format_bytes(l.frozen_bytes));
  else
    out += fmt::format("    frozen base   {:>12} in its dtype\n", format_bytes(l.frozen_bytes));
  if (l.adapters > 0)
    out += fmt::format("    adapters      {:>12} ({} adapters of rank {}, {} parameters): values {}, gradients {}, masters "
                       "{}, optimizer state {}\n",
                       format_bytes(l.adapter_bytes[0] + l.adapter_bytes[1] + l.adapter_bytes[2] + l.adapter_bytes[3]),
                       l.adapters, l.rank, l.adapter_elements, format_bytes(l.adapter_bytes[size_t(Category::parameters)]),
                       format_bytes(l.adapter_bytes[size_t(Category::gradients)]),
                       format_bytes(l.adapter_bytes[size_t(Category::master_weights)]),
                       format_bytes(l.adapter_bytes[size_t(Category::optimizer_state)]));
  out += fmt::format("    branch, tiles {:>12} x A^T of every adapter while saved; dequantisation tile {}, fp32 input "
                     "gradient {}\n",
                     format_bytes(l.branch_bytes), format_bytes(l.tile_bytes), format_bytes(l.input_grad_bytes));
  if (l.dora_magnitudes > 0)
    out += fmt::format("    DoRA          {:>12} z of every adapted product while saved; {} magnitudes (in the adapters); "
                       "norms ||W + s B A|| {:.1f} GFLOP per forward\n",
                       format_bytes(l.dora_saved_bytes), l.dora_magnitudes, l.dora_norm_flops / 1e9);
  return out;
}

std::string seconds(double s) { return s >= 1 ? fmt::format("{:.2f} s", s) : fmt::format("{:.1f} ms", s * 1e3); }

nlohmann::json lora_json(const LoraBreakdown& l) {
  if (!l.on) return nullptr;
  nlohmann::json adapter_bytes;
  for (Category c : {Category::parameters, Category::gradients, Category::master_weights, Category::optimizer_state})
    adapter_bytes[std::string(category_name(c))] = l.adapter_bytes[size_t(c)];
  return {{"adapters", l.adapters},
          {"rank", l.rank},
          {"adapter_parameters", l.adapter_elements},
          {"adapter_bytes", adapter_bytes},
          {"frozen_bytes", l.frozen_bytes},
          {"quantized_bytes", l.quantized_bytes},
          {"quantized_tensors", l.quantized_tensors},
          {"quantized_elements", l.quantized_elements},
          {"quantization", l.quant},
          {"branch_bytes", l.branch_bytes},
          {"tile_bytes", l.tile_bytes},
          {"input_grad_bytes", l.input_grad_bytes},
          {"dora_magnitudes", l.dora_magnitudes},
          {"dora_saved_bytes", l.dora_saved_bytes},
          {"dora_norm_flops", l.dora_norm_flops}};
}

}  // namespace

std::string format_estimate(const RankEstimate& e, const Cluster& c, const EstimateOptions& o) {
  std::string out = fmt::format("per rank on {} ({} GPU{} per node x {} node{}, world size {}):\n", c.hw.name,
                                c.gpus_per_node, c.gpus_per_node > 1 ? "s" : "", c.nodes, c.nodes > 1 ? "s" : "",
                                c.world_size());
  out += fmt::format("  {:<18}{:>14}{:>14}{:>14}\n", "category", "device", "host", "disk");
  for (Category cat : kAllCategories) {
    const size_t i = size_t(cat);
    const uint64_t d = e.by_tier[0][i], h = e.by_tier[1][i], k = e.by_tier[2][i];
    if (d + h + k == 0) continue;
    out += fmt::format("  {:<18}{:>14}{:>14}{:>14}\n", category_name(cat), format_bytes(d), format_bytes(h),
                       format_bytes(k));
  }
  out += fmt::format("  {:<18}{:>14}\n", "packing", format_bytes(e.packing_overhead));
  out += fmt::format("  {:<18}{:>14}   (framework context, GEMM workspace, collective buffers)\n", "runtime fixed",
                     format_bytes(e.fixed_overhead));
  out += fmt::format("  {:<18}{:>14}{:>14}{:>14}   of {} device memory\n", "total", format_bytes(e.device_bytes),
                     format_bytes(e.host_bytes), format_bytes(e.disk_bytes), format_bytes(c.hw.memory_bytes));
  out += fmt::format("  peak at op {} '{}' ({})\n", e.peak_op, e.peak_op_name, phase_name(e.peak_phase));
  if (e.lora.on)
    out += format_lora(e.lora);
  else if (!e.from_program)
    out += "  (offload, or frozen parameters with ZeRO: the analytic model, ZeRO sharding and offload applied to the "
           "unsharded plan's model-state categories as DeepSpeed places them on a GPU (gradients streamed to the "
           "host), an estimate without packing (no such program was planned); on this machine `memfit plan` without --hardware plans optimizer offload's real "
           "program)\n";
  else if (c.world_size() > 1 && e.ranks_planned == 1)
    out += fmt::format("  (rank 0's planned program of {} ranks; the others' pieces differ and may plan a few KiB more "
                       "or less)\n",
                       c.world_size());
  else if (c.world_size() > 1)
    out += e.largest_rank_device_bytes > e.device_bytes
               ? fmt::format("  (rank 0's planned program; all {} ranks planned: the largest is rank {}, {} more, {} in all)\n",
                             e.ranks_planned, e.largest_rank, format_bytes(e.largest_rank_device_bytes - e.device_bytes),
                             format_bytes(e.largest_rank_device_bytes))
               : fmt::format("  (rank 0's planned program; all {} ranks planned, none holds more)\n", e.ranks_planned);
  out += fmt::format("step time estimate: {} = compute {} + recompute {} + communication {} ({} per rank{}) + "
                     "offload {} ({}); {:.0f} tokens/s, MFU {:.0f}% (compute at {:.0f}% of peak)\n",
                     seconds(e.step_seconds), seconds(e.compute_seconds), seconds(e.recompute_seconds),
                     seconds(e.comm_seconds * (1 - o.comm_overlap)), format_bytes(uint64_t(e.comm_bytes)),
                     o.comm_overlap > 0 ? fmt::format(", {:.0f}% overlapped", o.comm_overlap * 100) : "",
                     seconds(e.offload_seconds), format_bytes(uint64_t(e.offload_bytes)), e.tokens_per_second,
                     e.model_flops_utilization * 100, o.efficiency * 100);
  if (c.hw.speeds_measured)
    out += fmt::format("  (peaks measured on this machine: fp32 products {:.0f} GFLOP/s, bf16 {:.0f} GFLOP/s, "
                       "streaming {:.1f} GB/s)\n",
                       c.hw.peak_fp32_flops / 1e9, c.hw.peak_bf16_flops / 1e9, c.hw.memory_bandwidth / 1e9);
  return out;
}

nlohmann::json estimate_json(const RankEstimate& e, const Cluster& c, const EstimateOptions& o) {
  nlohmann::json tiers;
  for (Tier t : kAllTiers) {
    nlohmann::json cats;
    for (Category cat : kAllCategories) cats[std::string(category_name(cat))] = e.by_tier[size_t(t)][size_t(cat)];
    tiers[std::string(tier_name(t))] = cats;
  }
  nlohmann::json model_states;
  for (Category cat : {Category::parameters, Category::gradients, Category::master_weights, Category::optimizer_state})
    model_states[std::string(category_name(cat))] = {{"device", e.states.device[size_t(cat)]},
                                                     {"host", e.states.host[size_t(cat)]},
                                                     {"disk", e.states.disk[size_t(cat)]},
                                                     {"unsharded", e.states.full[size_t(cat)]}};
  return {{"hardware", hardware_json(c.hw)},
          {"gpus_per_node", c.gpus_per_node},
          {"nodes", c.nodes},
          {"world_size", c.world_size()},
          {"per_rank",
           {{"by_tier", tiers},
            {"model_states", model_states},
            {"device_bytes", e.device_bytes},
            {"host_bytes", e.host_bytes},
            {"disk_bytes", e.disk_bytes},
            {"packing_overhead_bytes", e.packing_overhead},
            {"fixed_overhead_bytes", e.fixed_overhead},
            {"peak_op", {{"index", e.peak_op}, {"name", e.peak_op_name}, {"phase", phase_name(e.peak_phase)}}}}},
          {"sharding_is_estimate", !e.from_program},
          {"lora", lora_json(e.lora)},
          {"rank", 0},
          {"ranks_planned", e.ranks_planned},
          {"largest_rank", {{"rank", e.largest_rank}, {"device_bytes", e.device_bytes_of_largest_rank()}}},
          {"step",
           {{"seconds", e.step_seconds},
            {"compute_seconds", e.compute_seconds},
            {"recompute_seconds", e.recompute_seconds},
            {"communication_seconds", e.comm_seconds},
            {"communication_bytes_per_rank", e.comm_bytes},
            {"comm_overlap", o.comm_overlap},
            {"offload_seconds", e.offload_seconds},
            {"offload_bytes_per_rank", e.offload_bytes},
            {"efficiency", o.efficiency},
            {"tokens_per_second", e.tokens_per_second},
            {"model_flops_utilization", e.model_flops_utilization}}}};
}

}  // namespace memfit
