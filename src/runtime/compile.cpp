#include "runtime/compile.hpp"

#include <algorithm>
#include <array>
#include <string>

#include "core/error.hpp"

namespace memfit {

void attach_backend_scratch(Program& p, const Backend& backend) {
  std::vector<uint64_t> bytes(p.ops().size());
  std::array<uint64_t, kNumQueues> largest{};
  for (size_t i = 0; i < p.ops().size(); ++i) {
    const Op& op = p.op(int(i));
    bytes[i] = backend.scratch_bytes(p, op);
    uint64_t& l = largest[size_t(op.queue)];
    l = std::max(l, bytes[i]);
  }
  // Compute first: its tensor takes the id it had when it was the only scratch. Persistent, and
  // so laid out at the bottom of the arena: its size is what the library asks for, but the
  // library may leave the end of it untouched, and it must never be what sets the peak.
  std::array<TensorId, kNumQueues> scratch{};
  scratch.fill(kNoTensor);
  for (int q = 0; q < kNumQueues; ++q) {
    if (largest[size_t(q)] == 0) continue;
    const Queue queue = Queue(q);
    // One scratch serves one op at a time: a deeper queue would need one per op in flight.
    MEMFIT_CHECK(queue_depth(queue) == 1, "kernels",
                 "the backend asks for scratch on queue {}, but queue {} keeps {} ops in flight and a queue has one "
                 "scratch", queue_name(queue), queue_name(queue), queue_depth(queue));
    TensorDesc d;
    d.name = queue == Queue::compute ? std::string("library.scratch") : "library.scratch." + std::string(queue_name(queue));
    d.shape = Shape{int64_t(largest[size_t(q)])};
    d.dtype = DType::u8;
    d.category = Category::temporaries;
    d.lifetime = Lifetime::persistent;
    scratch[size_t(q)] = p.add_tensor(std::move(d));
  }
  for (size_t i = 0; i < p.ops().size(); ++i)
    if (bytes[i] > 0) p.ops()[i].workspace.push_back(scratch[size_t(p.op(int(i)).queue)]);
}

CompiledProgram compile_program(Program program, const Backend& backend) {
  attach_backend_scratch(program, backend);
  program.validate();
  TierAlignments alignments{};
  for (Tier t : kAllTiers) alignments[size_t(t)] = backend.buffer_type(t).alignment();
  MemoryPlan plan = plan_memory(program, alignments);
  return CompiledProgram{std::move(program), std::move(plan)};
}

}  // namespace memfit
