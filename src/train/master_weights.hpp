// Parameter values as fp32, whatever the parameter's own dtype. Under mixed precision a
// trainable parameter is 16-bit and its fp32 master (ParamEntry::master) holds the values
// the optimizer updates; initialisation, loading and saving go through the master and then
// round it into the parameter, so the 16-bit copy is always the master rounded to nearest.
#pragma once

#include <vector>

#include "graph/program.hpp"
#include "runtime/executor.hpp"

namespace memfit {

// Where a parameter's fp32 values live: its master, or the parameter itself when it is fp32;
// nullptr for a 16-bit parameter without a master (a frozen one).
float* fp32_values(const Executor& ex, const ParamEntry& e);

// Writes fp32 values into the parameter (rounded to its dtype) and into its master if any.
void store_parameter(const Executor& ex, const ParamEntry& e, const float* values);

// The parameter's values as fp32: the master's, or the parameter's widened.
std::vector<float> load_parameter(const Executor& ex, const ParamEntry& e);

// Rounds every master into its 16-bit parameter (after the masters were written).
void narrow_masters_into_parameters(const Executor& ex);

}  // namespace memfit
