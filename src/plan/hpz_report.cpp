#include "plan/hpz_report.hpp"

#include <algorithm>

#include <fmt/format.h>

#include "core/bytes.hpp"

namespace memfit {

HpzSummary hpz_summary(const Program& p, const MemoryPlan& plan) {
  HpzSummary s;
  const int peak = plan.tier(Tier::device).peak_op;
  for (TensorId id = 0; id < TensorId(p.tensors().size()); ++id) {
    const TensorDesc& t = p.tensor(id);
    if (t.is_view() || t.category != Category::communication || !t.name.starts_with("zero.params.") ||
        !t.name.ends_with(".secondary"))
      continue;
    ++s.buckets;
    s.bytes += t.bytes();
    s.largest = std::max<uint64_t>(s.largest, t.bytes());
    if (t.tier == Tier::device && peak >= 0 && plan.tensors[size_t(id)].live.contains(peak)) s.at_peak += t.bytes();
  }
  return s;
}

std::string describe_hpz(const HpzSummary& s, int partition) {
  if (s.buckets == 0) return "";
  return fmt::format("hpZ: secondary partitions over {} ranks (communication buffers, each alive from its bucket's "
                     "forward gather to its backward gather): {} buckets, {} in all, largest {}, {} live at the device "
                     "peak\n",
                     partition, s.buckets, format_bytes(s.bytes), format_bytes(s.largest), format_bytes(s.at_peak));
}

nlohmann::json hpz_json(const HpzSummary& s, int partition) {
  return {{"partition_size", partition}, {"secondary_buckets", s.buckets}, {"secondary_bytes", s.bytes},
          {"largest_secondary_bytes", s.largest}, {"secondary_bytes_at_device_peak", s.at_peak}};
}

}  // namespace memfit
