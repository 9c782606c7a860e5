// Questions tests ask of a planned program, answered from tensors and their intervals
// directly (not through plan/breakdown.hpp, whose buffers they check).
#pragma once

#include <cstdint>

#include "graph/program.hpp"
#include "plan/memory_plan.hpp"

namespace memfit::test {

// Index of the last op of `kind`; -1 when the program has none.
int last_op_of_kind(const Program& p, OpKind kind);

// Bytes of layer `layer`'s activation tensors whose live interval contains op `at`.
uint64_t activation_bytes_live_at(const Program& p, const MemoryPlan& plan, int64_t layer, int at);

}  // namespace memfit::test
