#include "support/plan_queries.hpp"

namespace memfit::test {

int last_op_of_kind(const Program& p, OpKind kind) {
  int found = -1;
  for (int i = 0; i < int(p.ops().size()); ++i)
    if (p.op(i).kind == kind) found = i;
  return found;
}

uint64_t activation_bytes_live_at(const Program& p, const MemoryPlan& plan, int64_t layer, int at) {
  uint64_t bytes = 0;
  for (size_t id = 0; id < p.tensors().size(); ++id) {
    const TensorDesc& t = p.tensors()[id];
    if (t.layer == layer && t.category == Category::activations && plan.tensors[id].live.contains(at))
      bytes += t.bytes();
  }
  return bytes;
}

}  // namespace memfit::test
