#include "plan/plan_compare.hpp"

#include "core/bytes.hpp"
#include "core/error.hpp"

namespace memfit {

namespace {

// A saving (base minus plan) as the change the plan makes: "-1.2 MiB" saved, "+3 MiB" spent.
std::string signed_bytes(int64_t saved) {
  if (saved == 0) return "0 B";
  return fmt::format("{}{}", saved < 0 ? "+" : "-", format_bytes(uint64_t(saved < 0 ? -saved : saved)));
}

}  // namespace

std::string format_plan_comparison(std::string_view base_label, const MemoryPlan& base, std::string_view label,
                                   const MemoryPlan& plan) {
  const TierPlan &a = base.tier(Tier::device), &b = plan.tier(Tier::device);
  std::string out = fmt::format("device tier at the peak, {} vs {}:\n", label, base_label);
  out += fmt::format("  {:<17} {:>12} {:>12} {:>13}\n", "", label, base_label, "difference");
  for (Category c : kAllCategories) {
    const uint64_t x = a.at_peak[size_t(c)], y = b.at_peak[size_t(c)];
    if (x == 0 && y == 0) continue;
    out += fmt::format("  {:<17} {:>12} {:>12} {:>13}\n", category_name(c), format_bytes(y), format_bytes(x),
                       signed_bytes(int64_t(x) - int64_t(y)));
  }
  out += fmt::format("  {:<17} {:>12} {:>12} {:>13}\n", "peak", format_bytes(b.peak_bytes), format_bytes(a.peak_bytes),
                     signed_bytes(int64_t(a.peak_bytes) - int64_t(b.peak_bytes)));
  return out;
}

nlohmann::json plan_comparison_json(std::string_view base_label, const MemoryPlan& base, std::string_view label,
                                    const MemoryPlan& plan) {
  auto side = [](const TierPlan& t) {
    nlohmann::json cats = nlohmann::json::object();
    for (Category c : kAllCategories) cats[std::string(category_name(c))] = t.at_peak[size_t(c)];
    return nlohmann::json{{"peak_bytes", t.peak_bytes}, {"by_category", cats}};
  };
  const TierPlan &a = base.tier(Tier::device), &b = plan.tier(Tier::device);
  nlohmann::json saved = nlohmann::json::object();
  for (Category c : kAllCategories)
    saved[std::string(category_name(c))] = int64_t(a.at_peak[size_t(c)]) - int64_t(b.at_peak[size_t(c)]);
  saved["peak"] = int64_t(a.peak_bytes) - int64_t(b.peak_bytes);
  return {{std::string(label), side(b)}, {std::string(base_label), side(a)}, {"saved_bytes", saved}};
}

}  // namespace memfit
