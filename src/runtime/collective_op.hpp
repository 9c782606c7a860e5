// Collective ops (all_reduce, reduce_scatter, all_gather, broadcast) run by the executor
// through a Communicator: collectives are the runtime's business, not a compute backend's,
// so every backend shares them. The subtle point: a reduce_scatter whose shard is the full
// buffer's own block (ZeRO-1 keeps full-size gradients and reduces them in place) runs as
// MPI's in-place form, which leaves the result at the *start* of the buffer; the op then
// moves it to the rank's block. A collective with an Op::async_id only starts in its op; the
// wait op with the same id completes it (and does that move).
#pragma once

#include <map>
#include <memory>

#include "dist/communicator.hpp"
#include "kernels/backend.hpp"

namespace memfit {

// A prepared collective that its wait op completes (graph/overlap_collectives.hpp).
class StartedCollective : public PreparedOp {
 public:
  virtual void complete() = 0;
};
// Started collectives whose wait op is not prepared yet, by Op::async_id
// (prepare time only).
using StartedCollectives = std::map<int, StartedCollective*>;

// Throws [runtime] when the op's world size differs from the communicator's, its tensors do
// not have the shapes op.hpp requires, or a wait names no started collective.
std::unique_ptr<PreparedOp> prepare_collective(const Program& p, const Op& op, const OpBinding& b, Communicator& comm,
                                               StartedCollectives& started);

}  // namespace memfit
