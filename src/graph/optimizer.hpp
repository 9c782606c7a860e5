// The optimizer as ops: its persistent state per parameter and the update step emitted into
// the "optimizer" section.
//   adamw:     m and v in fp32 (8 bytes per parameter); one fused op over every parameter.
//   adamw8bit: m and v as 8-bit codes in blocks of 256 with one fp32 absmax per block and
//              moment (2 + 8/256 = 2.03125 bytes per parameter), for tensors of at least
//              4096 elements; smaller tensors (biases, norms) keep fp32 state and get an adamw
//              op of their own, as bitsandbytes does.
// With gradient clipping a grad_norm op first writes the global norm (the persistent scalar
// kGradNorm, which the trainer reports), and the update ops read it.
#pragma once

#include <cstdint>

#include "graph/builder.hpp"
#include "graph/policy.hpp"

namespace memfit {

inline constexpr const char* kGradNorm = "grad_norm";
inline constexpr int64_t kQuantBlock = 256;           // elements per 8-bit block
inline constexpr int64_t kMin8bitElements = 4096;     // smaller tensors keep fp32 state

// The tensor the optimizer updates: the fp32 master copy under mixed precision, else the
// parameter itself.
TensorId update_target(const ParamEntry& e);

// Whether `e` keeps 8-bit state under `policy` (ParamEntry::state is then [m codes, v codes,
// m absmax, v absmax]; otherwise [m, v] in fp32).
bool has_8bit_state(const Program& p, const ParamEntry& e, const Policy& policy);

// Adds the optimizer state of every trainable parameter to ParamEntry::state.
void declare_optimizer_state(GraphBuilder& b, const Policy& policy);

// Emits the update of every trainable parameter from its gradient (phase optimizer).
void emit_optimizer_step(GraphBuilder& b, const Policy& policy);

}  // namespace memfit
