// Start-of-run state: parameters drawn per their ParamEntry (GPT-2: normal(0, 0.02), residual
// projections scaled, norms at one, biases at zero), padded vocabulary rows at zero (they are
// never a target and get no gradient), and every other persistent tensor (optimizer state,
// accumulated gradients, loss scalars) at zero. Under mixed precision the values are drawn into
// the fp32 masters and rounded into the 16-bit parameters (train/master_weights.hpp). Each parameter's values come from a seed
// derived from the run seed and the parameter's name, in fixed-size chunks, so they do not
// depend on the thread count, on the order of initialisation or on the staging size: values
// move into the tensors a staging buffer at a time (train/tensor_staging.hpp).
#pragma once

#include <cstdint>
#include <functional>

#include "graph/model_spec.hpp"
#include "runtime/executor.hpp"
#include "train/tensor_staging.hpp"

namespace memfit {

class BaseStart;

// `only`: when set, the parameters it accepts (the others keep their values). `start`: an
// OLoRA / PiSSA start (train/lora_base_start.hpp), made as a quantised base is quantised; the
// adapters it stores are not drawn.
void initialize_parameters(Executor& ex, const ModelSpec& spec, uint64_t seed, TensorStaging& staging,
                           const std::function<bool(const ParamEntry&)>& only = {}, BaseStart* start = nullptr);
// Every persistent tensor that is not a parameter, and the padding of parameter buckets.
void zero_persistent_state(Executor& ex, TensorStaging& staging);
void zero_padded_vocab_rows(Executor& ex, const ModelSpec& spec, TensorStaging& staging);
// The same with a staging buffer of their own (tests and benchmarks that set up one executor).
void initialize_parameters(Executor& ex, const ModelSpec& spec, uint64_t seed);
void zero_persistent_state(Executor& ex);

}  // namespace memfit
