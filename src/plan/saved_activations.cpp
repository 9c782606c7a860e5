#include "plan/saved_activations.hpp"

#include <algorithm>

namespace memfit {

std::vector<uint64_t> saved_activations_by_layer(const Program& p, const MemoryPlan& plan) {
  const Section* micro = p.find_section(SectionKind::micro);
  if (!micro) return {};
  int first_backward = -1, layers = 0;
  for (int i = micro->begin; i < micro->end; ++i) {
    layers = std::max(layers, p.op(i).layer + 1);
    if (first_backward < 0 && p.op(i).phase == Phase::backward) first_backward = i;
  }
  if (first_backward < 0) return {};
  std::vector<uint64_t> bytes(size_t(layers), 0);
  std::vector<char> counted(p.tensors().size(), 0);
  for (int i = micro->begin; i < first_backward; ++i) {
    const Op& op = p.op(i);
    if (op.phase != Phase::forward || op.layer < 0) continue;
    for (TensorId t : op.outputs) {
      if (t == kNoTensor) continue;
      const TensorId root = p.root_of(t);
      const TensorDesc& d = p.tensor(root);
      if (counted[size_t(root)] || d.category != Category::activations || d.lifetime != Lifetime::transient) continue;
      if (!plan.tensors[size_t(root)].live.contains(first_backward)) continue;
      counted[size_t(root)] = 1;
      bytes[size_t(op.layer)] += d.bytes();
    }
  }
  return bytes;
}

}  // namespace memfit
