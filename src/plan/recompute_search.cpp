#include "plan/recompute_search.hpp"

#include <algorithm>
#include <array>
#include <map>

#include "core/error.hpp"
#include "graph/recompute.hpp"
#include "graph/training_program.hpp"
#include "plan/memory_plan.hpp"

namespace memfit {

std::vector<BlockRecompute> recompute_levels(AttentionKind attention) {
  BlockRecompute none, norms, mlp, attn, whole;
  norms.norms = true;
  mlp = norms;
  mlp.mlp_activation = true;
  attn = mlp;
  attn.attention = true;
  whole.whole = true;
  if (attention == AttentionKind::flash) return {none, norms, mlp, whole};  // flash keeps no probabilities
  return {none, norms, mlp, attn, whole};
}

namespace {

// Builds and plans the program of one assignment (a level per block).
class Evaluator {
 public:
  Evaluator(const ModelSpec& spec, const Policy& policy, const Topology& topology, const OpCapabilities& backend,
            const ProgramPrepare& prepare)
      : spec_(spec), policy_(policy), topology_(topology), backend_(backend), prepare_(prepare),
        levels_(recompute_levels(policy.attention)) {
    policy_.recompute = RecomputePolicy{};
    policy_.recompute.mode = RecomputeMode::automatic;
  }

  struct Result {
    uint64_t peak = 0;
    uint64_t max_live = 0;  // largest live total: a lower bound on any placement's peak
    double flops = 0;
  };

  const std::vector<BlockRecompute>& levels() const { return levels_; }

  std::vector<BlockRecompute> blocks(const std::vector<int>& assignment) const {
    std::vector<BlockRecompute> out;
    for (int level : assignment) out.push_back(levels_[size_t(level)]);
    return out;
  }

  Program build(const std::vector<int>& assignment) const {
    Policy p = policy_;
    p.recompute.blocks = blocks(assignment);
    return build_training_program(spec_, p, topology_, backend_);
  }

  Result evaluate(const std::vector<int>& assignment) {
    Program p = build(assignment);
    if (prepare_) prepare_(p);
    ++planned_;
    const MemoryPlan plan = plan_memory(p);
    return {plan.tier(Tier::device).peak_bytes, plan.tier(Tier::device).max_live_bytes, recompute_flops(p)};
  }

  int planned() const { return planned_; }

 private:
  const ModelSpec& spec_;
  Policy policy_;
  const Topology& topology_;
  const OpCapabilities& backend_;
  const ProgramPrepare& prepare_;
  std::vector<BlockRecompute> levels_;
  int planned_ = 0;
};

// A sorted assignment as counts per level: the first counts[K-1] blocks at the top level, the
// next counts[K-2] one level lower, and so on down to block L-1.
using Counts = std::array<int, 8>;

std::vector<int> expand(const Counts& counts, int levels) {
  std::vector<int> a;
  for (int k = levels - 1; k >= 0; --k) a.insert(a.end(), size_t(counts[size_t(k)]), k);
  return a;
}

// Pointwise a <= b for sorted assignments: at every level threshold, a has no more blocks at
// or above it than b.
bool dominated(const Counts& a, const Counts& b, int levels) {
  int sa = 0, sb = 0;
  for (int k = levels - 1; k >= 1; --k) {
    sa += a[size_t(k)];
    sb += b[size_t(k)];
    if (sa > sb) return false;
  }
  return true;
}

void enumerate(int level, int remaining, Counts& counts, std::vector<Counts>& out) {
  if (level == 0) {
    counts[0] = remaining;
    out.push_back(counts);
    return;
  }
  for (int n = 0; n <= remaining; ++n) {
    counts[size_t(level)] = n;
    enumerate(level - 1, remaining - n, counts, out);
  }
  counts[size_t(level)] = 0;
}

RecomputeChoice make_choice(const Evaluator& ev, const std::vector<int>& assignment, const Evaluator::Result& r,
                            uint64_t budget) {
  RecomputeChoice c;
  c.blocks = ev.blocks(assignment);
  c.fits = r.peak <= budget;
  c.peak_bytes = r.peak;
  c.recompute_flops = r.flops;
  c.planned = ev.planned();
  return c;
}

// The search over block levels for the policy's own classifier chunk.
RecomputeChoice choose_levels(const ModelSpec& spec, const Policy& policy, const Topology& topology,
                              const OpCapabilities& backend, uint64_t budget, const ProgramPrepare& prepare) {
  Evaluator ev(spec, policy, topology, backend, prepare);
  const int L = int(spec.n_layer), K = int(ev.levels().size());
  MEMFIT_ASSERT(K <= int(Counts{}.size()), "{} recompute levels", K);
  // No recomputation first; then the most, whose live total bounds every candidate's from below.
  const std::vector<int> none(size_t(L), 0), most(size_t(L), K - 1);
  const Evaluator::Result r_none = ev.evaluate(none);
  if (r_none.peak <= budget) return make_choice(ev, none, r_none, budget);
  const Evaluator::Result r_most = ev.evaluate(most);
  if (r_most.max_live > budget) return make_choice(ev, most, r_most, budget);

  // Per-block cost of each level, from the programs themselves (blocks are alike).
  std::vector<double> cost(size_t(K), 0.0);
  for (int k = 1; k < K; ++k) cost[size_t(k)] = recompute_flops(ev.build(std::vector<int>(size_t(L), k))) / double(L);
  std::vector<Counts> candidates;
  Counts scratch{};
  enumerate(K - 1, L, scratch, candidates);
  auto cost_of = [&](const Counts& c) {
    double f = 0;
    for (int k = 0; k < K; ++k) f += c[size_t(k)] * cost[size_t(k)];
    return f;
  };
  std::stable_sort(candidates.begin(), candidates.end(),
                   [&](const Counts& a, const Counts& b) { return cost_of(a) < cost_of(b); });

  // Best first. A candidate whose live total exceeds the budget is hopeless: no placement fits
  // it. Keeping more never lowers the live total, so two prunings follow:
  // - a candidate that keeps at least as much as a hopeless one is hopeless (skipped unplanned);
  // - before planning a candidate, its relaxations are planned: the candidate with every block
  //   below level j raised to level j, for j from the top level down. A hopeless relaxation
  //   rules the candidate out, and every other candidate it dominates. There are few distinct
  //   relaxations, so whole regions of cheap-level mixes are ruled out by one plan.
  // The peak itself (live total plus the placement's holes) is not monotone in this way, so
  // only the live total prunes; a candidate is accepted on its peak.
  std::vector<Counts> hopeless;
  std::map<Counts, Evaluator::Result> known;
  auto dominated_by_hopeless = [&](const Counts& c) {
    return std::any_of(hopeless.begin(), hopeless.end(), [&](const Counts& h) { return dominated(c, h, K); });
  };
  auto evaluate = [&](const Counts& c) {
    if (auto it = known.find(c); it != known.end()) return it->second;
    const Evaluator::Result r = ev.evaluate(expand(c, K));
    known[c] = r;
    if (r.max_live > budget) hopeless.push_back(c);
    return r;
  };
  Counts none_counts{}, most_counts{};
  none_counts[0] = L;
  most_counts[size_t(K - 1)] = L;
  known[none_counts] = r_none;
  known[most_counts] = r_most;
  if (r_none.max_live > budget) hopeless.push_back(none_counts);
  std::vector<int> lowest = most;  // the lowest peak seen, returned when nothing fits
  Evaluator::Result r_lowest = r_most;
  for (const Counts& c : candidates) {
    if (dominated_by_hopeless(c)) continue;
    bool pruned = false;
    for (int j = K - 2; j >= 1 && !pruned; --j) {
      Counts relaxed = c;  // blocks below level j raised to j
      for (int k = 0; k < j; ++k) relaxed[size_t(j)] += relaxed[size_t(k)], relaxed[size_t(k)] = 0;
      if (relaxed != c) pruned = dominated_by_hopeless(relaxed) || evaluate(relaxed).max_live > budget;
    }
    if (pruned) continue;
    const Evaluator::Result r = evaluate(c);
    if (r.peak <= budget) return make_choice(ev, expand(c, K), r, budget);
    if (r.peak < r_lowest.peak) lowest = expand(c, K), r_lowest = r;
  }
  return make_choice(ev, lowest, r_lowest, budget);
}

// FLOPs of the classifier's products per micro-step: the logits and their input gradient.
double classifier_flops(const ModelSpec& spec, const Policy& policy) {
  return 2.0 * 2.0 * double(policy.batch * policy.seq) * double(spec.n_embd) * double(spec.padded_vocab);
}

}  // namespace

std::vector<int64_t> smaller_classifier_chunks(const ModelSpec& spec, const Policy& policy) {
  std::vector<int64_t> out;
  if (policy.classifier_chunk_rows > 0) return out;
  constexpr int64_t kFewestRows = 256;
  for (int64_t rows = classifier_chunk_rows(spec, policy) / 2 / 16 * 16; rows >= kFewestRows; rows = rows / 2 / 16 * 16)
    out.push_back(rows);
  return out;
}

RecomputeChoice choose_recompute(const ModelSpec& spec, const Policy& policy, const Topology& topology,
                                 const OpCapabilities& backend, uint64_t budget, const ProgramPrepare& prepare) {
  RecomputeChoice best = choose_levels(spec, policy, topology, backend, budget, prepare);
  int planned = best.planned;
  const double worth = 0.1 * classifier_flops(spec, policy);
  for (int64_t rows : smaller_classifier_chunks(spec, policy)) {
    if (best.fits && best.recompute_flops <= worth) break;  // nothing left a smaller chunk could repay
    Policy p = policy;
    p.classifier_chunk_rows = rows;
    RecomputeChoice c = choose_levels(spec, p, topology, backend, budget, prepare);
    planned += c.planned;
    const bool better = c.fits ? (!best.fits || c.recompute_flops < best.recompute_flops - worth)
                               : (!best.fits && c.peak_bytes < best.peak_bytes);
    if (!better) continue;
    c.classifier_chunk_rows = rows;
    best = std::move(c);
  }
  best.planned = planned;
  return best;
}

std::vector<RecomputeCandidate> plan_every_assignment(const ModelSpec& spec, const Policy& policy,
                                                      const Topology& topology, const OpCapabilities& backend,
                                                      const ProgramPrepare& prepare) {
  Evaluator ev(spec, policy, topology, backend, prepare);
  const int L = int(spec.n_layer), K = int(ev.levels().size());
  std::vector<RecomputeCandidate> out;
  std::vector<int> a(size_t(L), 0);
  while (true) {
    const Evaluator::Result r = ev.evaluate(a);
    out.push_back({ev.blocks(a), r.peak, r.flops});
    int i = 0;  // next assignment, counting in base K
    while (i < L && ++a[size_t(i)] == K) a[size_t(i++)] = 0;
    if (i == L) break;
  }
  return out;
}

RecomputeChoice choose_recompute_exhaustive(const std::vector<RecomputeCandidate>& all, uint64_t budget) {
  const RecomputeCandidate* best = nullptr;
  for (const RecomputeCandidate& c : all)
    if (c.peak_bytes <= budget &&
        (!best || c.recompute_flops < best->recompute_flops ||
         (c.recompute_flops == best->recompute_flops && c.peak_bytes < best->peak_bytes)))
      best = &c;
  RecomputeChoice choice;
  choice.planned = int(all.size());
  if (!best) return choice;
  choice.blocks = best->blocks;
  choice.fits = true;
  choice.peak_bytes = best->peak_bytes;
  choice.recompute_flops = best->recompute_flops;
  return choice;
}

}  // namespace memfit
