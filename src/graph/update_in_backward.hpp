// Optimizer in backward: each parameter is updated as soon as the backward pass is done with
// it, and its gradient dies there, so the step never holds all gradients at once (PyTorch's
// "optimizer step in backward", LOMO's fused update). A transformation of the step program:
// the optimizer section's update ops are split per parameter and moved into the micro-step,
// each right after the last op that reads or writes the parameter, its master copy or its
// gradient; the master-to-parameter narrowing casts move with them.
//
// Subtle point: "last use" includes reads of the parameter itself, not only the gradient's
// last write: a linear layer's d(weight) may finish before its d(input) product reads the
// weight, and recomputed forward ops read parameters in the backward too. Results are bitwise
// those of the grouped update (the update is elementwise, the same kernel per element).
//
// Needs every gradient complete within one micro-step and nothing that looks at all gradients
// before any update: one micro-step per optimizer step, no clipping (global norm), no dynamic
// loss scaling (an overflow must skip the whole step). check_update_in_backward() refuses the rest.
#pragma once

#include <string>

#include "graph/policy.hpp"
#include "graph/program.hpp"

namespace memfit {

// Why `policy` cannot update in backward, or "" when it can; check_* throws it when asked for.
std::string update_in_backward_refusal(const Policy& policy);
void check_update_in_backward(const Policy& policy);
void apply_update_in_backward(Program& program);

}  // namespace memfit
