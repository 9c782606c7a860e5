// The optimizer as ops: its persistent state per parameter and the update step emitted into
// the "optimizer" section. AdamW (decoupled weight decay, bias correction) is one fused op
// over every trainable parameter, so its state is read and written in one pass.
#pragma once

#include "graph/builder.hpp"
#include "graph/policy.hpp"

namespace memfit {

// Adds the optimizer state of every parameter (AdamW: m and v, fp32) to ParamEntry::state.
void declare_optimizer_state(GraphBuilder& b, const Policy& policy);

// Emits the update of every trainable parameter from its gradient (phase optimizer).
void emit_optimizer_step(GraphBuilder& b, const Policy& policy);

}  // namespace memfit
