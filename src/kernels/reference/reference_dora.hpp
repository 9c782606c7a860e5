// The reference DoRA ops (graph/op.hpp dora_norm, dora_scale, dora_scale_backward): fp32
// storage, plain loops, every sum in double. They share nothing with kernels/cpu/dora.cpp.
#pragma once

#include <memory>

#include "graph/program.hpp"
#include "kernels/backend.hpp"

namespace memfit::ref {

std::unique_ptr<PreparedOp> prepare_dora(const Program& p, const Op& op, const OpBinding& b);

}  // namespace memfit::ref
