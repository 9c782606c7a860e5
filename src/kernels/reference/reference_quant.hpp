// The reference backend's quant_linear / quant_linear_backward (fp32): each tile of each
// segment of W dequantised with the same codec as the CPU's (kernels/quant/blockwise.hpp),
// then plain loops with double sums, one rounding per output element (per tile for dx, as
// kernels/quant/quant_matmul.hpp's reference does).
#pragma once

#include <memory>

#include "kernels/backend.hpp"

namespace memfit::ref {

std::unique_ptr<PreparedOp> prepare_quant_linear(const Program& p, const Op& op, const OpBinding& b);

}  // namespace memfit::ref
