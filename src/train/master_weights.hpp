// Parameter values as fp32, whatever the parameter's own dtype. Under mixed precision a
// trainable parameter is 16-bit and its fp32 master (ParamEntry::master) holds the values
// the optimizer updates; initialisation, loading and saving go through the master and then
// round it into the parameter, so the 16-bit copy is always the master rounded to nearest.
// Values move a range of elements at a time through the run's TensorStaging, never as a
// whole-parameter copy and never by address (train/tensor_staging.hpp).
#pragma once

#include <span>

#include "graph/program.hpp"
#include "runtime/executor.hpp"
#include "train/tensor_staging.hpp"

namespace memfit {

// Throws [train] unless the parameter is stored as one value tensor, the only storage whose
// values exist as floats (quantised storage is read through the ops a forward rewrite emits).
void require_float_values(const ParamEntry& e);

// Sets elements [first, first + values.size()) of the parameter: its master (the part this
// rank holds) to `values`, and its value (this rank's piece under ZeRO-3) to them rounded to
// its dtype. `values` must not lie in staging.raw(), which the rounding uses.
void store_parameter_range(Executor& ex, const ParamEntry& e, int64_t first, std::span<const float> values,
                           TensorStaging& staging);

// Elements [first, first + out.size()) of the parameter as fp32: the master's when it holds the
// whole parameter, else the parameter's widened. Throws [train] for a ZeRO-3 sharded parameter
// (no whole copy persists). `out` must not lie in staging.raw().
void load_parameter_range(const Executor& ex, const ParamEntry& e, int64_t first, std::span<float> out,
                          TensorStaging& staging);

}  // namespace memfit
