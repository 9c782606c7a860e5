// Pieces of the ZeRO pass (zero.cpp) that read the program and the layout but none of the
// pass's state. Internal to graph/zero*.cpp.
#pragma once

#include <optional>
#include <vector>

#include "graph/zero.hpp"

namespace memfit {

// Per bucket, the first op of `ops` (numbered as p's sections number them) in pass 0 (forward),
// 1 (backward and recompute) or 2 (eval) that reads one of its parameters' values; -1 where
// that pass reads none.
std::vector<int> bucket_first_uses(const Program& p, const ZeroLayout& L, const std::vector<Op>& ops, size_t pass);

// The fill that zeroes bucket b's unused tail in its gradient bucket `grad_root` (after its last
// parameter), so reductions never read stale bytes; nullopt when the parameters fill the bucket.
std::optional<Op> bucket_padding_fill(Program& p, const ZeroBucket& b, TensorId grad_root);

}  // namespace memfit
