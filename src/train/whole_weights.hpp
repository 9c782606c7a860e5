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

// The trainable parameters' one-rank fp32 values under tensor parallelism, for a LoRA run's
// `--save` (the adapters, trained biases and modules_to_save: small next to the base, which
// stays where it is). Each rank places its slice (graph/tensor_parallel.hpp's runs) into zeros
// of the global shape and one sum over its tensor group (the run's, so no communicator is split
// for it) completes it; a parameter the group replicates is read whole. The slices are read
// from the executor, or under ZeRO taken from `slices` (gather_whole_parameters over the data
// group: this tensor rank's whole slices). Frozen parameters stay empty. Every rank of the
// group calls it.
std::vector<std::vector<float>> gather_tensor_parallel_trainable(const Executor& ex, Communicator& tensor_group,
                                                                 TensorStaging& staging,
                                                                 const std::vector<std::vector<float>>* slices = nullptr);

}  // namespace memfit
