// LoRA starts that rewrite the base (PEFT's init_lora_weights "olora", "pissa",
// "pissa_niter_N"): each target's adapters take low-rank factors of its weight W
// (train/lora_start_factors.hpp) and W becomes W - scale B A, before DoRA's magnitudes are
// taken (as PEFT's update_layer orders them). The first forward is then the base model's.
// A float base is rewritten in place once loaded. A quantised base is started from the float
// values its quantiser reads (at initialisation or --load), so what is quantised is the
// residual itself (QPiSSA, Meng et al. 2024: the quantisation error is that of W - scale B A,
// not of W), never a dequantised copy.
#pragma once

#include <cstdint>
#include <set>
#include <string>

#include "graph/lora.hpp"
#include "graph/policy.hpp"
#include "runtime/executor.hpp"
#include "train/lora_start_factors.hpp"
#include "train/quantized_weights.hpp"
#include "train/tensor_staging.hpp"

namespace memfit {

bool rewrites_base(const LoraPolicy& lora);

class BaseStart {
 public:
  // seed: the run's (pissa_niter_N's Gaussian start is drawn from it and the module's name).
  BaseStart(const LoraPolicy& lora, uint64_t seed) : lora_(lora), seed_(seed) {}

  // The values a quantised parameter's quantiser reads, with W - scale B A in the pieces the
  // start adapts; their adapters' A and B are stored now. `values` itself for any other.
  SegmentValues quantized_values(Executor& ex, const ParamEntry& e, SegmentValues values, TensorStaging& staging);
  // Whether start() or quantized_values() has stored the parameter (an adapter's A or B).
  bool stored(const std::string& param) const { return stored_.count(param) > 0; }
  // Starts every float-stored target in place. Throws [lora] for a float base sharded by ZeRO-3,
  // and for a quantised target that quantized_values() did not see.
  void start(Executor& ex, TensorStaging& staging);

 private:
  struct Started {
    LowRankFactors f;
    double scale = 0;
    size_t piece = 0;  // of a quantised weight
  };
  // The target's factors from `read` (W's rows), its A and B stored.
  Started start_module(Executor& ex, const LinearModule& m, const WeightRows& read, TensorStaging& staging);

  LoraPolicy lora_;
  uint64_t seed_;
  std::set<std::string> stored_, quantized_started_;
};

// Bytes a BaseStart holds beside the staging, at most (the process plan's share).
uint64_t base_start_scratch_bytes(const Program& p, const LoraPolicy& lora);

// The seed of a module's Gaussian start under pissa_niter_N.
uint64_t pissa_seed(uint64_t seed, const std::string& module);

}  // namespace memfit
