#include "train/process_plan.hpp"

#include <cstdlib>

#include <fmt/format.h>

#include "core/bytes.hpp"
#include "runtime/rss.hpp"
#include "train/lora_base_start.hpp"
#include "train/run_setup.hpp"

namespace memfit {

bool within_process_tolerance(uint64_t planned, uint64_t rss) {
  const double tolerance = kProcessToleranceShare * double(planned) + double(kProcessToleranceBytes);
  return std::abs(double(rss) - double(planned)) <= tolerance;
}

ProcessPlan plan_process(const RunState& s) {
  ProcessPlan p;
  p.before_tiers = resident_set_bytes();
  p.communication = s.comm->resident_bytes();
  for (int i = 0; i < s.groups->distinct_count(); ++i)
    if (Communicator* c = s.groups->distinct()[size_t(i)]; c != s.comm) p.communication += c->resident_bytes();
  for (Tier t : kAllTiers)
    if (t != Tier::disk && s.backend->buffer_type(t).host_readable()) p.tiers += s.run.compiled.plan.tier(t).peak_bytes;
  // The staging buffer is mapped but untouched until initialisation writes through it.
  p.staging = 3 * TensorStaging::kElements * sizeof(float) +
              2 * uint64_t(s.run.policy.batch * s.run.policy.seq) * sizeof(int32_t) +
              base_start_scratch_bytes(s.program(), s.run.policy.lora);
  return p;
}

std::string describe_process_plan(const ProcessPlan& p) {
  return fmt::format(
      "process: planned peak RSS {} ({} bytes) = {} before the tiers (of which {} communication scratch) + {} of "
      "tiers in process memory + {} staging\n",
      format_bytes(p.planned()), p.planned(), format_bytes(p.before_tiers), format_bytes(p.communication),
      format_bytes(p.tiers), format_bytes(p.staging));
}

std::string describe_process_check(const ProcessPlan& p, uint64_t max_rss) {
  const uint64_t planned = p.planned();
  const bool ok = within_process_tolerance(planned, max_rss);
  const double diff = double(max_rss) - double(planned);
  return fmt::format("process: max RSS {} ({} bytes) against the planned {} ({} bytes): {} {} ({:+.2f}%), {}\n",
                     format_bytes(max_rss), max_rss, format_bytes(planned), planned, diff >= 0 ? "+" : "-",
                     format_bytes(uint64_t(std::abs(diff))), 100.0 * diff / double(planned),
                     ok ? "within 2% + 25 MiB" : "OUTSIDE 2% + 25 MiB: memory the plan does not hold");
}

nlohmann::json process_json(const ProcessPlan& p, uint64_t max_rss) {
  return {{"planned_peak_rss_bytes", p.planned()},
          {"before_tiers_bytes", p.before_tiers},
          {"communication_bytes", p.communication},
          {"tiers_bytes", p.tiers},
          {"staging_bytes", p.staging},
          {"max_rss_bytes", max_rss},
          {"within_tolerance", within_process_tolerance(p.planned(), max_rss)}};
}

}  // namespace memfit
