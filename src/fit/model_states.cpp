#include "fit/model_states.hpp"

#include "core/error.hpp"

namespace memfit {

StateElements model_state_elements(const Program& p) {
  StateElements e;
  auto add = [&](TensorId id) {
    if (id == kNoTensor) return;
    const TensorDesc& t = p.tensor(id);
    e[{t.category, t.dtype}] += t.numel();
  };
  for (const ParamEntry& entry : p.params()) {
    for (const StoredTensor& stored : entry.storage) add(stored.id);  // value, or codes + scales
    add(entry.grad);
    add(entry.master);
    for (TensorId s : entry.state) add(s);
  }
  return e;
}

uint64_t ShardedStates::device_total() const {
  uint64_t t = 0;
  for (uint64_t b : device) t += b;
  return t;
}

ShardedStates shard_model_states(const StateElements& elements, int stage, int world, Tier offload_optimizer,
                                 Tier offload_params) {
  MEMFIT_CHECK(stage >= 0 && stage <= 3, "policy", "ZeRO stage must be 0, 1, 2 or 3 (got {})", stage);
  MEMFIT_CHECK(world >= 1, "policy", "world size must be at least 1 (got {})", world);
  ShardedStates s;
  auto sharded = [&](Category c) {
    switch (c) {
      case Category::optimizer_state:
      case Category::master_weights: return stage >= 1;
      case Category::gradients: return stage >= 2;
      case Category::parameters: return stage >= 3;
      default: return false;
    }
  };
  for (const auto& [key, elems] : elements) {
    const auto [cat, dtype] = key;
    const size_t c = size_t(cat);
    s.full[c] += dtype_bytes(dtype, elems);
    const int64_t per_rank = sharded(cat) ? (elems + world - 1) / world : elems;
    const uint64_t bytes = dtype_bytes(dtype, per_rank);
    Tier tier = Tier::device;
    if (cat == Category::optimizer_state || cat == Category::master_weights) tier = offload_optimizer;
    if (cat == Category::parameters) tier = offload_params;
    (tier == Tier::device ? s.device : tier == Tier::host ? s.host : s.disk)[c] += bytes;
  }
  // The host update reads fp32 gradients: ZeRO-Offload keeps a copy of this rank's gradient
  // shard there (the device keeps its 16-bit gradients for the reduction).
  if (offload_optimizer != Tier::device) {
    int64_t grads = 0;
    for (const auto& [key, elems] : elements)
      if (key.first == Category::gradients) grads += elems;
    const int64_t per_rank = stage >= 2 ? (grads + world - 1) / world : grads;
    (offload_optimizer == Tier::host ? s.host : s.disk)[size_t(Category::gradients)] += dtype_bytes(DType::f32, per_rank);
    // From stage 2 on, gradients stream to the host through the reduce bucket as the backward
    // produces them (ZeRO-Offload): the device keeps none (the bucket is counted apart).
    if (stage >= 2) s.device[size_t(Category::gradients)] = 0;
  }
  return s;
}

}  // namespace memfit
