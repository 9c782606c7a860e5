// Model states (parameters, gradients, master weights, optimizer state) of a program, and
// what ZeRO sharding and offload do to them per rank.
//
// LABELLED ESTIMATE, kept where the training program cannot express the policy (offload until
// issue 16; frozen parameters or the update in backward with ZeRO) and as the test oracle of
// the rank programs (fit/estimate.hpp plans those): sharding applied to the categories of the
// unsharded program, as the ZeRO paper describes: stage 1 shards optimizer state and master
// weights, stage 2 also gradients, stage 3 also parameters, each flattened per dtype and padded
// to a multiple of the world size (every rank holds ceil(elements / world) of them). Offload
// moves the optimizer state and master weights (and the fp32 gradient copy the host update
// reads) or the parameters to the host or disk tier; from stage 2 on, an offloaded optimizer's
// gradients stream to the host as they are produced and the device keeps none of them.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <utility>

#include "graph/policy.hpp"
#include "graph/program.hpp"

namespace memfit {

// Elements of persistent model state per (category, dtype), over every parameter entry:
// parameters (value), gradients (grad, whatever its lifetime), master weights, optimizer state.
using StateElements = std::map<std::pair<Category, DType>, int64_t>;
StateElements model_state_elements(const Program& program);

struct ShardedStates {
  std::array<uint64_t, kNumCategories> full{};   // bytes per category, one copy of the model
  std::array<uint64_t, kNumCategories> device{};  // per rank, on the device
  std::array<uint64_t, kNumCategories> host{};    // per rank, on the host
  std::array<uint64_t, kNumCategories> disk{};    // per rank, on disk
  uint64_t device_total() const;
};

// Per-rank model states under `stage` on `world` ranks with the policy's offload tiers.
ShardedStates shard_model_states(const StateElements& elements, int stage, int world,
                                 Tier offload_optimizer = Tier::device, Tier offload_params = Tier::device);

}  // namespace memfit
