#include "plan/plan_report.hpp"

#include "core/bytes.hpp"
#include "core/error.hpp"
#include "plan/saved_activations.hpp"

namespace memfit {

namespace {

nlohmann::json op_json(const Program& p, int index) {
  if (index < 0) return nullptr;
  const Op& op = p.op(index);
  return {{"index", index},
          {"name", op.name},
          {"kind", op_kind_name(op.kind)},
          {"phase", phase_name(op.phase)},
          {"layer", op.layer}};
}

nlohmann::json tier_json(const Program& p, const TierPlan& t) {
  nlohmann::json cats = nlohmann::json::object();
  for (Category c : kAllCategories) cats[std::string(category_name(c))] = t.at_peak[size_t(c)];
  return {{"peak_bytes", t.peak_bytes},
          {"by_category", cats},
          {"free_at_peak_bytes", t.free_at_peak},
          {"max_live_bytes", t.max_live_bytes},
          {"packing_ratio", t.packing_ratio()},
          {"peak_op", op_json(p, t.peak_op)}};
}

// Optimizer state of every trainable parameter (all tiers), and per trainable parameter.
std::pair<uint64_t, double> optimizer_state(const Program& p) {
  uint64_t bytes = 0;
  int64_t trainable = 0;
  for (const ParamEntry& e : p.params()) {
    if (!e.trainable) continue;
    trainable += p.tensor(e.value).numel();
    for (TensorId id : e.state) bytes += p.tensor(id).bytes();
  }
  return {bytes, trainable ? double(bytes) / double(trainable) : 0.0};
}

}  // namespace

std::string format_memory_table(const Program& p, const MemoryPlan& plan) {
  std::string out;
  if (const auto [bytes, per_param] = optimizer_state(p); bytes > 0)
    out += fmt::format("optimizer state: {} ({} bytes), {:.4f} bytes per trainable parameter\n", format_bytes(bytes),
                       bytes, per_param);
  for (Tier tier : kAllTiers) {
    const TierPlan& t = plan.tier(tier);
    if (t.peak_bytes == 0 && tier != Tier::device) continue;
    out += fmt::format("{} tier: planned peak {} ({} bytes)\n", tier_name(tier), format_bytes(t.peak_bytes), t.peak_bytes);
    for (Category c : kAllCategories) {
      const uint64_t b = t.at_peak[size_t(c)];
      if (b == 0) continue;
      out += fmt::format("  {:<17} {:>12}  {:5.1f}%\n", category_name(c), format_bytes(b),
                         100.0 * double(b) / double(std::max<uint64_t>(t.peak_bytes, 1)));
    }
    if (t.free_at_peak > 0) out += fmt::format("  {:<17} {:>12}\n", "(free at peak)", format_bytes(t.free_at_peak));
    if (t.peak_op >= 0) {
      const Op& op = p.op(t.peak_op);
      out += fmt::format("  peak at op {} '{}' ({}, {})\n", t.peak_op, op.name, op_kind_name(op.kind), phase_name(op.phase));
    }
    out += fmt::format("  largest live total {} (peak / live = {:.4f})\n", format_bytes(t.max_live_bytes),
                       t.packing_ratio());
  }
  return out;
}

nlohmann::json memory_json(const Program& p, const MemoryPlan& plan, const std::optional<TierBytes>& measured) {
  const TierPlan& dev = plan.tier(Tier::device);
  nlohmann::json j = tier_json(p, dev);
  nlohmann::json out;
  out["planned_peak_bytes"] = nlohmann::json::object();
  out["tiers"] = nlohmann::json::object();
  for (Tier tier : kAllTiers) {
    out["planned_peak_bytes"][std::string(tier_name(tier))] = plan.tier(tier).peak_bytes;
    out["tiers"][std::string(tier_name(tier))] = tier_json(p, plan.tier(tier));
  }
  out["planned_by_category"] = j["by_category"];
  out["planned_free_at_peak_bytes"] = dev.free_at_peak;
  out["peak_op"] = j["peak_op"];
  out["max_live_bytes"] = dev.max_live_bytes;
  out["packing_ratio"] = dev.packing_ratio();
  const auto [state_bytes, state_per_param] = optimizer_state(p);
  out["optimizer_state_bytes"] = state_bytes;
  out["optimizer_state_bytes_per_parameter"] = state_per_param;
  out["saved_activations_by_layer"] = saved_activations_by_layer(p, plan);
  if (measured) {
    out["measured_peak_bytes"] = nlohmann::json::object();
    for (Tier tier : kAllTiers) out["measured_peak_bytes"][std::string(tier_name(tier))] = (*measured)[size_t(tier)];
  }
  return out;
}

}  // namespace memfit
