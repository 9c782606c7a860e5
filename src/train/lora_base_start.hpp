// LoRA starts that rewrite the base (PEFT's init_lora_weights "olora", "pissa",
// "pissa_niter_N"): each target's adapters take low-rank factors of its weight W
// (train/lora_start_factors.hpp) and W becomes W - scale B A, before DoRA's magnitudes are
// taken (as PEFT's update_layer orders them). The first forward is then the base model's.
#pragma once

#include <cstdint>

#include "graph/policy.hpp"
#include "runtime/executor.hpp"
#include "train/tensor_staging.hpp"

namespace memfit {

bool rewrites_base(const LoraPolicy& lora);

// Sets every adapter of ex's program and rewrites the base rows it adapts (a no-op unless
// rewrites_base(lora)). Throws [lora] for a base stored quantised or sharded by ZeRO-3.
// seed: the run's (pissa_niter_N's Gaussian start is drawn from it and the module's name).
void start_adapters_from_base(Executor& ex, const LoraPolicy& lora, uint64_t seed, TensorStaging& staging);

// Bytes start_adapters_from_base holds beside the staging, at most (the process plan's share).
uint64_t base_start_scratch_bytes(const Program& p, const LoraPolicy& lora);

// The seed of a module's Gaussian start under pissa_niter_N.
uint64_t pissa_seed(uint64_t seed, const std::string& module);

}  // namespace memfit
