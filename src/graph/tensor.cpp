#include "graph/tensor.hpp"

#include "core/error.hpp"

namespace memfit {

std::string_view category_name(Category c) {
  switch (c) {
    case Category::parameters: return "parameters";
    case Category::master_weights: return "master_weights";
    case Category::gradients: return "gradients";
    case Category::optimizer_state: return "optimizer_state";
    case Category::activations: return "activations";
    case Category::temporaries: return "temporaries";
    case Category::communication: return "communication";
    case Category::offload_staging: return "offload_staging";
    case Category::kv_cache: return "kv_cache";
  }
  MEMFIT_ASSERT(false, "unknown category {}", int(c));
}

std::string_view tier_name(Tier t) {
  switch (t) {
    case Tier::device: return "device";
    case Tier::host: return "host";
    case Tier::disk: return "disk";
  }
  MEMFIT_ASSERT(false, "unknown tier {}", int(t));
}

Tier parse_tier(std::string_view name) {
  for (Tier t : kAllTiers)
    if (tier_name(t) == name) return t;
  if (name == "cpu") return Tier::host;
  if (name == "nvme") return Tier::disk;
  if (name == "none" || name == "gpu") return Tier::device;
  throw Error("graph", fmt::format("unknown memory tier '{}' (expected device, host or disk)", name));
}

}  // namespace memfit
