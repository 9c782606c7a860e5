// Collective ops (all_reduce, reduce_scatter, all_gather, broadcast) run by the executor
// through a Communicator: collectives are the runtime's business, not a compute backend's,
// so every backend shares them. The subtle point: a reduce_scatter whose shard is the full
// buffer's own block (ZeRO-1 keeps full-size gradients and reduces them in place) runs as
// MPI's in-place form, which leaves the result at the *start* of the buffer; the op then
// moves it to the rank's block.
#pragma once

#include <memory>

#include "dist/communicator.hpp"
#include "kernels/backend.hpp"

namespace memfit {

bool is_collective(OpKind kind);

// Throws [runtime] when the op's world size differs from the communicator's, or its tensors
// do not have the shapes op.hpp requires.
std::unique_ptr<PreparedOp> prepare_collective(const Program& p, const Op& op, const OpBinding& b, Communicator& comm);

}  // namespace memfit
