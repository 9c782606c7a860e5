// Tensors of a step program: shape, element type, what the bytes are for (category), where
// they live (tier) and how long (lifetime). A tensor may be a view into another tensor's
// bytes (a slice of a flat buffer, a shard); views share their root's placement.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

#include "core/dtype.hpp"
#include "core/shape.hpp"

namespace memfit {

using TensorId = int32_t;
inline constexpr TensorId kNoTensor = -1;

// Reported everywhere in this order.
enum class Category : uint8_t {
  parameters,
  master_weights,
  gradients,
  optimizer_state,
  activations,      // saved for backward, and a step's inputs and outputs
  temporaries,      // workspaces, intermediate values that die inside a phase, recompute buffers
  communication,    // collective buffers, gathered parameter blocks
  offload_staging,  // bounce buffers of transfers between tiers
  kv_cache,         // generation: every layer's cached keys and values (graph/inference_program.hpp)
};
inline constexpr int kNumCategories = 9;
inline constexpr std::array<Category, kNumCategories> kAllCategories = {
    Category::parameters,   Category::master_weights, Category::gradients,     Category::optimizer_state,
    Category::activations,  Category::temporaries,    Category::communication, Category::offload_staging,
    Category::kv_cache};

enum class Tier : uint8_t { device, host, disk };
inline constexpr int kNumTiers = 3;
inline constexpr std::array<Tier, kNumTiers> kAllTiers = {Tier::device, Tier::host, Tier::disk};

// persistent: lives across steps (parameters, optimizer state); its bytes are never reused.
// transient: lives from the first op that touches it to the last one (see plan/liveness.hpp).
enum class Lifetime : uint8_t { persistent, transient };

std::string_view category_name(Category c);
std::string_view tier_name(Tier t);
Tier parse_tier(std::string_view name);  // throws [graph]

struct TensorDesc {
  std::string name;
  Shape shape;
  DType dtype = DType::f32;
  Category category = Category::activations;
  Tier tier = Tier::device;
  Lifetime lifetime = Lifetime::transient;
  bool requires_grad = false;
  int layer = -1;  // transformer block index, -1 outside blocks
  // A view aliases bytes [view_offset, view_offset + bytes) of view_of (a root tensor).
  TensorId view_of = kNoTensor;
  uint64_t view_offset = 0;
  // Tensor parallelism: an input replicated over the tensor group and read by column-parallel
  // products, whose gradient each rank holds only a partial sum of; autodiff sums it over the
  // group before the backward of the op that wrote it (graph/tensor_parallel.hpp).
  bool grad_summed_over_tensor_group = false;

  int64_t numel() const { return shape.numel(); }
  uint64_t bytes() const { return dtype_bytes(dtype, shape.numel()); }
  bool is_view() const { return view_of != kNoTensor; }
};

}  // namespace memfit
