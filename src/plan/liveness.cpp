#include "plan/liveness.hpp"

#include <algorithm>

namespace memfit {

std::vector<Interval> compute_liveness(const Program& p) {
  const int n_ops = int(p.ops().size());
  std::vector<Interval> live(p.tensors().size());
  auto touch = [&](TensorId id, int i) {
    if (id == kNoTensor) return;
    Interval& iv = live[size_t(p.root_of(id))];
    if (iv.first < 0) iv.first = i;
    iv.last = std::max(iv.last, i);
  };
  for (int i = 0; i < n_ops; ++i) {
    const Op& op = p.op(i);
    for (TensorId t : op.inputs) touch(t, i);
    for (TensorId t : op.outputs) touch(t, i);
    for (TensorId t : op.workspace) touch(t, i);
  }
  for (size_t id = 0; id < live.size(); ++id) {
    const TensorDesc& t = p.tensors()[id];
    if (!t.is_view() && t.lifetime == Lifetime::persistent && n_ops > 0) live[id] = {0, n_ops - 1};
  }
  for (const Section& s : p.sections()) {
    if (s.repeat <= 1 || s.begin == s.end) continue;
    const int lo = s.begin, hi = s.end - 1;
    for (Interval& iv : live) {
      if (!iv.used() || iv.last < lo || iv.first > hi) continue;  // disjoint from the loop
      if (iv.first >= lo && iv.last <= hi) continue;             // inside one iteration
      iv.first = std::min(iv.first, lo);
      iv.last = std::max(iv.last, hi);
    }
  }
  for (size_t id = 0; id < live.size(); ++id) {
    const TensorDesc& t = p.tensors()[id];
    if (t.is_view()) live[id] = live[size_t(t.view_of)];
  }
  return live;
}

}  // namespace memfit
