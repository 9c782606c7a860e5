#include "plan/buffers.hpp"

#include <algorithm>

#include "core/error.hpp"

namespace memfit {

std::vector<PlannedBuffer> planned_buffers(const Program& p, const MemoryPlan& plan) {
  int n_buffers = 0;
  for (const TensorPlacement& pl : plan.tensors) n_buffers = std::max(n_buffers, pl.buffer + 1);
  std::vector<PlannedBuffer> out(static_cast<size_t>(n_buffers));
  for (size_t id = 0; id < p.tensors().size(); ++id) {
    const TensorDesc& t = p.tensors()[id];
    const TensorPlacement& pl = plan.tensors[id];
    if (t.is_view() || pl.buffer < 0) continue;
    out[size_t(pl.buffer)].members.push_back(TensorId(id));
  }
  for (PlannedBuffer& b : out) {
    MEMFIT_ASSERT(!b.members.empty(), "a planned buffer holds no root tensor");
    std::stable_sort(b.members.begin(), b.members.end(), [&](TensorId x, TensorId y) {
      return plan.tensors[size_t(x)].live.first < plan.tensors[size_t(y)].live.first;
    });
    const TensorPlacement& first = plan.tensors[size_t(b.members.front())];
    b.tier = first.tier;
    b.persistent = p.tensor(b.members.front()).lifetime == Lifetime::persistent;
    b.offset = first.offset;
    b.bytes = first.bytes;
    b.live = first.live;
    for (TensorId m : b.members) {
      const TensorPlacement& pl = plan.tensors[size_t(m)];
      MEMFIT_ASSERT(pl.offset == b.offset && pl.bytes <= b.bytes, "member {} of a buffer is not inside it",
                    p.tensor(m).name);
      b.live.first = std::min(b.live.first, pl.live.first);
      b.live.last = std::max(b.live.last, pl.live.last);
    }
  }
  return out;
}

TensorId buffer_holder(const PlannedBuffer& b, const MemoryPlan& plan, int op) {
  TensorId holder = b.members.front();
  for (TensorId m : b.members)
    if (plan.tensors[size_t(m)].live.first <= op) holder = m;
  return holder;
}

std::vector<uint64_t> planned_arena_top(const std::vector<PlannedBuffer>& buffers, Tier tier, int n_ops) {
  std::vector<uint64_t> top(size_t(n_ops), 0);
  uint64_t persistent_top = 0;
  for (const PlannedBuffer& b : buffers) {
    if (b.tier != tier) continue;
    if (b.persistent) {
      persistent_top = std::max(persistent_top, b.offset + b.bytes);
      continue;
    }
    for (int op = b.live.first; op <= b.live.last; ++op) top[size_t(op)] = std::max(top[size_t(op)], b.offset + b.bytes);
  }
  for (uint64_t& t : top) t = std::max(t, persistent_top);
  return top;
}

}  // namespace memfit
