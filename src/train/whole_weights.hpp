// Whole parameters out of ZeRO shards, for `--save` (HF safetensors) of a data-parallel run.
// Under ZeRO >= 1 the fp32 values the optimizer updates (the masters under mixed precision,
// the parameters themselves at stage 3) exist only as each rank's pieces; every rank calls
// this, and each gets every parameter's whole fp32 values, the same bytes a single-rank run
// would hold. Not part of a step: it runs between steps and uses host buffers outside the
// plan, one fp32 bucket (a transformer block) at a time plus the result.
#pragma once

#include <vector>

#include "dist/communicator.hpp"
#include "runtime/executor.hpp"
#include "train/tensor_staging.hpp"

namespace memfit {

// Indexed like Program::params(). Throws [train] on a program whose parameters are not laid
// out the way graph/zero.cpp lays them (a bug, not bad input).
// Each rank's pieces are read through `staging` (Executor::read, never by address).
std::vector<std::vector<float>> gather_whole_parameters(const Executor& ex, Communicator& comm, TensorStaging& staging);

}  // namespace memfit
