// Collective ops (all_reduce, reduce_scatter, all_gather, broadcast, all_to_all) run by the executor
// through the Communicator of the op's group (CollectiveAttrs::group): collectives are the
// runtime's business, not a compute backend's, so every backend shares them. The subtle point:
// a reduce_scatter whose shard is the full buffer's own block (ZeRO-1 keeps full-size gradients
// and reduces them in place) runs as MPI's in-place form, which leaves the result at the
// *start* of the buffer; the op then moves it to the rank's block. A collective with an
// Op::async_id only starts in its op; the wait op with the same id completes it (and does that
// move).
#pragma once

#include <array>
#include <map>
#include <memory>

#include "dist/communicator.hpp"
#include "graph/policy.hpp"
#include "graph/program.hpp"
#include "kernels/backend.hpp"

namespace memfit {

// The communicators of one rank's groups, built once from the world communicator and the
// topology: the data group of rank r is the ranks with r's tensor rank (ordered by data rank),
// its tensor group the ranks of r's replica (adjacent ranks, ordered by tensor rank). A group
// that spans the whole world is the world communicator itself, a group of one a single-process
// communicator: only groups in between are split (collectively) from the world. qgZ's node
// and across_nodes groups (graph/op.hpp) are split when the data group spans several nodes of
// several ranks (Topology::data_per_node), else they are the data group.
class CommGroups {
 public:
  // A world of one: every group is one single-process communicator.
  CommGroups();
  // Splits `world` (collective over it; not owned, must outlive this). Throws [runtime] when the
  // topology's world is not the communicator's. hpz_partition > 1 (ZeRO++ hpZ, graph/zero_hpz.hpp:
  // hpz_partition()) also makes the hpZ group, that many consecutive ranks of the data group.
  // `program` given: the node, across_nodes and hpz groups are split only when one of its
  // collectives runs over them (each split holds the transport's scratch for the whole run);
  // every rank's program names the same groups, so every rank takes the same branches.
  CommGroups(Communicator& world, const Topology& topology, int hpz_partition = 1,
             const Program* program = nullptr);
  Communicator& operator[](CommGroup g) const { return *groups_[size_t(g)]; }
  // Each communicator once: the executor keeps each one's collectives in flight moving.
  const std::array<Communicator*, kNumCommGroups>& distinct() const { return distinct_; }
  int distinct_count() const { return distinct_count_; }

 private:
  static Communicator* group(Communicator& world, int size, const char* name, int color, int key,
                             std::unique_ptr<Communicator>& own);
  void add_distinct(Communicator* c);

  std::unique_ptr<Communicator> own_world_, data_, tensor_;
  std::unique_ptr<Communicator> node_, across_nodes_;  // qgZ's two hops
  std::unique_ptr<Communicator> hpz_;                  // hpZ's backward gathers
  std::array<Communicator*, kNumCommGroups> groups_{};
  std::array<Communicator*, kNumCommGroups> distinct_{};
  int distinct_count_ = 0;
};

// A prepared collective that its wait op completes (graph/schedule_async.hpp).
class StartedCollective : public PreparedOp {
 public:
  virtual void complete() = 0;
};
// Started collectives whose wait op is not prepared yet, by Op::async_id
// (prepare time only).
using StartedCollectives = std::map<int, StartedCollective*>;

// Throws [runtime] when the op's group size differs from its communicator's, its tensors do
// not have the shapes op.hpp requires, or a wait names no started collective.
std::unique_ptr<PreparedOp> prepare_collective(const Program& p, const Op& op, const OpBinding& b,
                                               const CommGroups& groups, StartedCollectives& started);

}  // namespace memfit
