// The activations a training step keeps from its forward pass for its backward, per
// transformer block: what activation-memory formulas such as Korthikanti et al. 2022's
// ("Reducing Activation Recomputation in Large Transformer Models") count per layer.
#pragma once

#include <cstdint>
#include <vector>

#include "graph/program.hpp"
#include "plan/memory_plan.hpp"

namespace memfit {

// Bytes per layer (index = Op::layer) of the activation buffers live across the micro
// section's first backward op that a forward op of that layer wrote: the tensors saved for the
// backward. Views count once, as their root. Empty without a backward.
std::vector<uint64_t> saved_activations_by_layer(const Program& program, const MemoryPlan& plan);

}  // namespace memfit
