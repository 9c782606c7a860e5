// DoRA's magnitudes start as PEFT starts them: m = ||W + scale B A|| per output row, from the
// base weights and adapters as they are once loaded or initialised.
#pragma once

#include "runtime/executor.hpp"
#include "train/tensor_staging.hpp"

namespace memfit {

// Sets every DoRA magnitude of ex's program (a no-op without DoRA). Throws [train] where a base
// weight has no whole copy on this rank (ZeRO-3) or is stored quantised.
void initialize_dora_magnitudes(Executor& ex, TensorStaging& staging);

}  // namespace memfit
