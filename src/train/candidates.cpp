#include "train/candidates.hpp"

#include "core/error.hpp"
#include "plan/search.hpp"
#include "train/trainer.hpp"

namespace memfit {

double flops_per_token(const Program& p, const Policy& pol) {
  double flops = 0;
  for (int i = 0; i < int(p.ops().size()); ++i) {
    const int s = p.section_of_op(i);
    if (s < 0) continue;
    flops += p.op(i).flops * double(p.sections()[size_t(s)].runs_per_step());
  }
  return flops / double(pol.batch * pol.seq * pol.grad_accum);
}

CandidatePlan plan_candidate(const RunConfig& c, const Backend& backend) {
  CandidatePlan out;
  try {
    const PreparedRun run = prepare_run(c, backend);
    const TierPlan& t = run.compiled.plan.tier(Tier::device);
    out.built = true;
    out.peak = memory_peak(run.compiled.plan);
    out.peak_op = t.peak_op;
    out.flops_per_token = flops_per_token(run.compiled.program, run.policy);
  } catch (const Error& e) {
    out.refused = e.what();
    out.unsupported = e.piece() == "policy" && out.refused.find("not supported") != std::string::npos;
  }
  return out;
}

uint64_t memory_peak(const MemoryPlan& plan) {
  return plan.tier(Tier::device).peak_bytes + plan.tier(Tier::host).peak_bytes;
}

RunConfig with_batch(RunConfig c, int64_t batch) {
  c.policy.batch = batch;
  return c;
}

int64_t largest_fitting_batch(const RunConfig& c, const Backend& backend, uint64_t budget, int64_t hi) {
  FitSearch search([&](int64_t b) {
    const CandidatePlan p = plan_candidate(with_batch(c, b), backend);
    return p.built && p.peak <= budget;
  });
  return std::max<int64_t>(0, search.largest(1, hi));
}

std::string make_runnable(RunConfig& c, const ModelSpec& spec, const Backend& backend) {
  const Policy& p = c.policy;
  const bool grouped = spec.n_kv_head > 0 && spec.n_kv_head < spec.n_head;
  if (backend.name() != "cpu" || !grouped || p.precision == Precision::fp32 || p.attention != AttentionKind::plain)
    return "";
  c.policy.attention = AttentionKind::flash;
  return " --attention flash";
}

}  // namespace memfit
