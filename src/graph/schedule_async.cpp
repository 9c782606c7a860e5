// The scheduling pass (see schedule_async.hpp): one forward scan per asynchronous candidate for
// the first op that must not run before it completes, then one rebuild of the op list with the
// waits inserted there.
#include "graph/schedule_async.hpp"

#include <algorithm>
#include <map>

#include "core/error.hpp"

namespace memfit {

namespace {

struct ByteRange {
  TensorId root;
  uint64_t begin, end;
  bool overlaps(const ByteRange& o) const { return root == o.root && begin < o.end && o.begin < end; }
};

ByteRange range_of(const Program& p, TensorId id) {
  const TensorDesc& t = p.tensor(id);
  const uint64_t begin = t.is_view() ? t.view_offset : 0;
  return {p.root_of(id), begin, begin + t.bytes()};
}

bool touches(const Program& p, const std::vector<TensorId>& ids, const std::vector<ByteRange>& ranges) {
  for (TensorId id : ids) {
    if (id == kNoTensor) continue;
    const ByteRange r = range_of(p, id);
    for (const ByteRange& q : ranges)
      if (r.overlaps(q)) return true;
  }
  return false;
}

bool schedulable(const Op& op, const AsyncOptions& options) {
  if (op.queue == Queue::compute || op.kind == OpKind::wait || op.async_id >= 0) return false;
  return queue_engine(op.queue) != Engine::communicator || options.overlap_comm;
}

// The index before which the op at `i` must complete: the first later op that reads or writes
// its outputs or writes its inputs, or that starts the queue_depth-th later op of the same
// queue (so at most that many are in flight); at the latest the end of its section.
int wait_position(const Program& p, int i, int section_end) {
  const Op& c = p.op(i);
  std::vector<ByteRange> in, out;
  for (TensorId id : c.inputs) in.push_back(range_of(p, id));
  for (TensorId id : c.outputs) out.push_back(range_of(p, id));
  int same_queue = 0;
  for (int j = i + 1; j < section_end; ++j) {
    const Op& op = p.op(j);
    if (op.queue == c.queue && op.kind != OpKind::wait && ++same_queue >= queue_depth(c.queue)) return j;
    if (touches(p, op.inputs, out) || touches(p, op.outputs, out) || touches(p, op.workspace, out)) return j;
    if (touches(p, op.outputs, in) || touches(p, op.workspace, in)) return j;
  }
  return section_end;
}

Op wait_for(const Op& start, int async_id) {
  Op wait;
  wait.kind = OpKind::wait;
  wait.phase = queue_engine(start.queue) == Engine::transfer ? Phase::transfer : Phase::communication;
  wait.queue = start.queue;
  wait.layer = start.layer;
  wait.name = start.name + ".wait";
  wait.inputs = start.inputs;
  wait.outputs = start.outputs;
  wait.modes.assign(wait.outputs.size(), WriteMode::update);
  wait.attrs = start.attrs;
  wait.async_id = async_id;
  return wait;
}

}  // namespace

void schedule_async(Program& p, const AsyncOptions& options) {
  const std::vector<Op>& old = p.ops();
  const int n = int(old.size());
  std::vector<std::vector<int>> waits_before(size_t(n) + 1);  // index n: after the last op
  std::vector<int> async_id(size_t(n), -1);
  int next_id = 0;
  for (const Op& op : old) next_id = std::max(next_id, op.async_id + 1);  // ids a builder already gave
  const int first_id = next_id;
  for (int i = 0; i < n; ++i) {
    const Op& op = old[size_t(i)];
    if (!schedulable(op, options)) continue;
    const int s = p.section_of_op(i);
    MEMFIT_ASSERT(s >= 0, "op '{}' on queue {} outside every section", op.name, queue_name(op.queue));
    const int w = wait_position(p, i, p.sections()[size_t(s)].end);
    if (w == i + 1) continue;  // needed at once: stays blocking
    async_id[size_t(i)] = next_id++;
    waits_before[size_t(w)].push_back(i);
  }
  if (next_id == first_id) return;

  std::vector<Op> ops;
  std::vector<int> section_of, new_index(size_t(n), -1);
  auto emit_waits = [&](int position, int section) {
    for (int i : waits_before[size_t(position)]) {
      ops.push_back(wait_for(old[size_t(i)], async_id[size_t(i)]));
      section_of.push_back(section);
    }
  };
  for (int i = 0; i < n; ++i) {
    // Waits before op i belong to op i - 1's section: a wait at a section's end is emitted
    // after the section's last op, before the next section's first.
    if (i > 0) emit_waits(i, p.section_of_op(i - 1));
    Op op = old[size_t(i)];
    if (async_id[size_t(i)] >= 0) op.async_id = async_id[size_t(i)];
    new_index[size_t(i)] = int(ops.size());
    ops.push_back(std::move(op));
    section_of.push_back(p.section_of_op(i));
  }
  emit_waits(n, p.section_of_op(n - 1));
  for (Op& op : ops)
    if (op.replays >= 0) op.replays = new_index[size_t(op.replays)];
  p.replace_ops(std::move(ops), section_of);
}

std::vector<AsyncSpan> async_spans(const Program& p) {
  std::map<int, AsyncSpan> by_id;
  for (int i = 0; i < int(p.ops().size()); ++i) {
    const Op& op = p.op(i);
    if (op.async_id < 0) continue;
    AsyncSpan& c = by_id[op.async_id];
    (op.kind == OpKind::wait ? c.wait : c.start) = i;
  }
  std::vector<AsyncSpan> out;
  for (const auto& [id, c] : by_id) out.push_back(c);
  return out;
}

}  // namespace memfit
