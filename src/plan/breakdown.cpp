#include "plan/breakdown.hpp"

#include <algorithm>
#include <map>

#include "core/error.hpp"

namespace memfit {

std::vector<LiveTensor> live_tensors_at(const Program& p, const MemoryPlan& plan, const std::vector<PlannedBuffer>& buffers,
                                        Tier tier, int op) {
  std::vector<LiveTensor> out;
  if (op < 0) return out;
  for (const PlannedBuffer& b : buffers) {
    if (b.tier != tier || !b.live.contains(op)) continue;
    LiveTensor t;
    t.tensor = buffer_holder(b, plan, op);
    const TensorDesc& d = p.tensor(t.tensor);
    t.bytes = b.bytes;
    t.category = d.category;
    t.layer = d.layer;
    t.persistent = b.persistent;
    t.born = plan.tensors[size_t(t.tensor)].live.first;
    t.dies = plan.tensors[size_t(t.tensor)].live.last;
    out.push_back(t);
  }
  std::sort(out.begin(), out.end(), [](const LiveTensor& a, const LiveTensor& b) {
    return a.bytes != b.bytes ? a.bytes > b.bytes : a.tensor < b.tensor;
  });
  return out;
}

std::vector<LayerBytes> bytes_by_layer(const std::vector<LiveTensor>& live) {
  std::map<int, LayerBytes> by;
  for (const LiveTensor& t : live) {
    LayerBytes& l = by[t.layer];
    l.layer = t.layer;
    l.by_category[size_t(t.category)] += t.bytes;
    l.total += t.bytes;
  }
  std::vector<LayerBytes> out;
  for (auto& [layer, bytes] : by) out.push_back(bytes);
  return out;
}

std::string describe_live_tensor(const Program& p, const LiveTensor& t) {
  const TensorDesc& d = p.tensor(t.tensor);
  std::string where = t.layer >= 0 ? fmt::format(", layer {}", t.layer) : "";
  if (t.persistent) return fmt::format("{} ({}{}, persistent)", d.name, category_name(t.category), where);
  return fmt::format("{} ({}{}, made by '{}', last used by '{}')", d.name, category_name(t.category), where,
                     p.op(t.born).name, p.op(t.dies).name);
}

}  // namespace memfit
