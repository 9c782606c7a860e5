#include "train/max_batch.hpp"

#include <map>
#include <sstream>

#include "core/bytes.hpp"
#include "core/error.hpp"
#include "plan/plan_report.hpp"
#include "plan/search.hpp"
#include "train/budget.hpp"
#include "train/candidates.hpp"
#include "train/trainer.hpp"

namespace memfit {

namespace {

constexpr int64_t kBatchLimit = int64_t(1) << 20;

std::vector<int64_t> auto_seqs(int64_t max_seq) {
  std::vector<int64_t> out;
  for (int64_t t = max_seq; t >= 16 || out.empty(); t /= 2) {
    out.push_back(t);
    if (t == 1) break;
  }
  return out;
}

}  // namespace

MaxBatchAnswer search_max_batch(const RunConfig& config, bool seq_auto, uint64_t budget, const Backend& backend) {
  MaxBatchAnswer best;
  std::vector<int64_t> seqs = {config.policy.seq};
  if (seq_auto) seqs = auto_seqs(resolve_model(config.model).max_seq);
  for (int64_t seq : seqs) {
    RunConfig c = config;
    c.policy.seq = seq;
    std::map<int64_t, uint64_t> peaks;
    FitSearch search([&](int64_t b) {
      const CandidatePlan cand = plan_candidate(with_batch(c, b), backend);
      // Refused at batch 1: the policy itself is refused, say so. Refused at a larger batch: that
      // batch is beyond a size bound (rows the kernels index, bytes a tier holds): it does not fit.
      if (!cand.built && b == 1) throw Error("max-batch", cand.refused);
      if (!cand.built) return false;
      peaks[b] = cand.peak;
      return cand.peak <= budget;
    });
    const int64_t b = std::max<int64_t>(0, search.largest(1, kBatchLimit));
    search.fits(b + 1);  // the plan just past the answer (already planned by the search, except at the limit)
    best.plans += search.probes();
    if (seq_auto) best.frontier.emplace_back(seq, b);
    // Sequence lengths come longest first: the first one where a batch fits is the answer.
    if (best.batch == 0) {
      best.seq = seq;
      best.batch = b;
      best.peak = b > 0 ? peaks[b] : 0;
      best.next_peak = peaks[b + 1];
    }
  }
  return best;
}

StepCheck run_one_step(RunConfig c, uint64_t budget) {
  StepCheck check;
  const uint64_t available = available_memory_bytes();
  if (budget > available) {
    check.why_not = fmt::format("the budget {} is more than this machine's available memory {}", format_bytes(budget),
                                format_bytes(available));
    return check;
  }
  c.steps = 1;
  c.eval_batches = 1;
  c.memory_budget = budget;
  c.report_json.clear();
  c.save.clear();
  std::ostringstream sink;
  const nlohmann::json report = run_training(c, sink);
  check.ran = true;
  check.planned = report["memory"]["planned_peak_bytes"]["device"].get<uint64_t>();
  check.measured = report["memory"]["measured_peak_bytes"]["device"].get<uint64_t>();
  return check;
}

void max_batch_command(const RunConfig& config, bool seq_auto, bool verify, bool as_json, std::ostream& out) {
  auto backend = make_backend(config.backend);
  const uint64_t budget = config.memory_budget ? config.memory_budget : available_memory_bytes();
  const MaxBatchAnswer a = search_max_batch(config, seq_auto, budget, *backend);
  RunConfig at = config;
  at.policy.seq = a.seq;
  StepCheck check;
  if (a.batch > 0 && verify) check = run_one_step(with_batch(at, a.batch), budget);
  if (a.batch > 0 && verify && check.ran)
    MEMFIT_CHECK(check.ok() && check.measured <= budget, "max-batch",
                 "the real step at batch {} measured {} but the plan said {} (budget {})", a.batch, check.measured,
                 check.planned, budget);

  if (as_json) {
    nlohmann::json j = {{"budget_bytes", budget}, {"seq", a.seq},    {"batch", a.batch},
                        {"peak_bytes", a.peak},   {"next_peak_bytes", a.next_peak}, {"plans", a.plans},
                        {"verified", check.ok()}, {"measured_peak_bytes", check.measured}};
    if (!check.ran) j["not_verified_because"] = verify ? check.why_not : "--no-verify";
    j["frontier"] = nlohmann::json::array();
    for (auto [seq, b] : a.frontier) j["frontier"].push_back({{"seq", seq}, {"batch", b}});
    out << j.dump(2) << "\n";
    MEMFIT_CHECK(a.batch > 0, "max-batch", "not even batch 1 fits the budget of {}", format_bytes(budget));
    return;
  }
  out << fmt::format("memfit max-batch: model {}, budget {} ({} bytes), {} plans searched\n", config.model,
                     format_bytes(budget), budget, a.plans);
  for (auto [seq, b] : a.frontier) out << fmt::format("  seq {:>6}: largest batch {}\n", seq, b);
  // Not even batch 1: what would make it fit, as the out-of-memory diagnosis of that run says.
  if (a.batch == 0) {
    const PreparedRun one = prepare_run(with_batch(at, 1), *backend);
    out << fmt::format("batch 1 x {} tokens does not fit:\n", a.seq)
        << diagnose_budget(with_batch(at, 1), one, budget, *backend).report;
  }
  MEMFIT_CHECK(a.batch > 0, "max-batch", "not even batch 1 at sequence length {} fits the budget of {} (it needs {})",
               a.seq, format_bytes(budget), format_bytes(a.next_peak));
  out << fmt::format("largest micro-batch that fits: {} x {} tokens (planned peak {}, {} below the budget)\n", a.batch,
                     a.seq, format_bytes(a.peak), format_bytes(budget - a.peak));
  if (!verify) out << "not verified (--no-verify)\n";
  else if (!check.ran) out << fmt::format("not verified: {}\n", check.why_not);
  else
    out << fmt::format("verified: one real step at batch {}: measured high-water {} ({} bytes), equal to the plan\n",
                       a.batch, format_bytes(check.measured), check.measured);
  for (int64_t b : {a.batch, a.batch + 1}) {
    const PreparedRun run = prepare_run(with_batch(at, b), *backend);
    const uint64_t peak = memory_peak(run.compiled.plan);
    out << fmt::format("plan at batch {} ({}):\n", b,
                       peak <= budget ? "fits" : fmt::format("does not fit: {} over", format_bytes(peak - budget)));
    out << format_memory_table(run.compiled.program, run.compiled.plan);
  }
}

}  // namespace memfit
