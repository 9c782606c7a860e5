// Filling the storage of a quantised frozen weight (graph/quantize_base.hpp) from its float
// values, at initialisation and at --load: the values are rounded to the compute dtype first
// (bitsandbytes quantises the bf16 weight a bf16 model holds), then quantised piece by piece
// (kernels/quant/quant_segments.hpp) and written into the codes, scales, scales2 and offset.
#pragma once

#include <span>

#include "graph/program.hpp"
#include "runtime/executor.hpp"

namespace memfit {

// Whether the parameter is stored quantised (codes, no value tensor).
bool is_quantized_param(const ParamEntry& e);

// Quantises the whole parameter (values: its elements in memfit's row order) into its storage.
// Holds the codes of one parameter on the heap while it runs (never inside a step).
void store_quantized_parameter(Executor& ex, const ParamEntry& e, std::span<const float> values);

}  // namespace memfit
