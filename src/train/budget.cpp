#include "train/budget.hpp"

#include <algorithm>
#include <functional>
#include <map>

#include "core/bytes.hpp"
#include "core/error.hpp"
#include "graph/training_program.hpp"
#include "graph/update_in_backward.hpp"
#include "plan/search.hpp"
#include "train/candidates.hpp"

namespace memfit {

namespace {

constexpr size_t kTensorsShown = 6;

// A technique tried as a whole-run change: its flags and how it edits the config. Techniques
// on the same knob (the recomputation modes, the ZeRO stages, ...) are alternatives: they are
// never paired with each other.
struct Technique {
  std::string flags;
  ChangeCost cost;
  std::function<void(RunConfig&)> apply;
  std::string effect = {};  // empty: cost_words
  std::string knob = {};
};

// Most suggestions that fit shown per cost class: the cheapest few say what the class offers,
// and every one of them was planned.
constexpr size_t kShownPerCost = 4;

// LoRA as QLoRA uses it: rank 8 on every linear layer (alpha 16, as is usual for r = 8), then
// with the frozen base in NF4 and double quantisation. Runs that already freeze weights are
// offered the quantised base alone, among the ordinary techniques.
constexpr int64_t kLoraRank = 8;

void apply_lora(RunConfig& c) {
  c.policy.lora.rank = kLoraRank;
  c.policy.lora.alpha = 2.0 * double(kLoraRank);
  c.policy.lora.targets = {"all-linear"};
  c.policy.lora.target_regex.clear();
}

// As the flags appended to the command do: bf16 and flash attention unless the run chose.
void apply_nf4(RunConfig& c) {
  c.policy.quantize_base.kind = BaseQuant::nf4;
  c.policy.quantize_base.double_quant = true;
  apply_quantised_base_defaults(c);
}

std::vector<Technique> adapter_techniques(const Policy& p) {
  const std::string lora = fmt::format("--lora-rank {} --lora-alpha {} --lora-targets all-linear", kLoraRank,
                                       2 * kLoraRank);
  const std::string nf4 = "--quantize-base nf4 --double-quant";
  const std::string trains = fmt::format("trains rank-{} adapters only, every base weight frozen", kLoraRank);
  std::vector<Technique> out;
  if (p.lora.enabled() || !p.freeze.empty() || p.quantize_base.enabled()) return out;
  out.push_back({lora, ChangeCost::changes_what_trains, apply_lora, trains, "lora"});
  out.push_back({lora + " " + nf4, ChangeCost::changes_what_trains,
                 [](RunConfig& c) {
                   apply_lora(c);
                   apply_nf4(c);
                 },
                 trains + " and stored in NF4 (QLoRA)", "lora"});
  return out;
}

// ZeRO over the ranks the run already has (with one rank it shards nothing, and a stage is
// not a way to get more ranks). Stages 1 and 2 communicate what plain data parallelism does
// (a reduce-scatter and an all-gather move the bytes of one all-reduce); stage 3 gathers the
// parameters in the backward again.
void zero_techniques(const Policy& p, const Topology& t, std::vector<Technique>& out) {
  if (t.data <= 1) return;
  static const char* const kShards[] = {"", "optimizer state", "optimizer state and gradients",
                                        "optimizer state, gradients and parameters"};
  for (int stage = std::max(1, p.zero_stage + 1); stage <= 3; ++stage)
    out.push_back({fmt::format("--zero {}", stage), stage < 3 ? ChangeCost::same_math : ChangeCost::more_communication,
                   [stage](RunConfig& c) { c.policy.zero_stage = stage; },
                   fmt::format("{} sharded over the {} ranks{}", kShards[stage], t.data,
                               stage < 3 ? "" : ", parameters gathered twice per micro-step"),
                   "zero"});
}

// Disk offload writes its files in `dir`: the run's --offload-dir, else the current directory,
// so that the flags run as printed.
std::vector<Technique> techniques(const Policy& p, const Topology& topology, const std::string& dir) {
  std::vector<Technique> out;
  auto recompute = [&](const char* mode) {
    if (p.recompute.to_string() == mode) return;
    out.push_back({fmt::format("--recompute {}", mode), ChangeCost::more_compute,
                   [mode](RunConfig& c) { c.policy.recompute = parse_recompute(mode); }, "", "recompute"});
  };
  // Same math, a different order: only where every gradient is complete in one micro-step.
  if (!p.update_in_backward && update_in_backward_refusal(p).empty())
    out.push_back({"--optimizer-in-backward", ChangeCost::same_math,
                   [](RunConfig& c) { c.policy.update_in_backward = true; }, "", "update"});
  zero_techniques(p, topology, out);
  recompute("selective");
  recompute("every:sqrt");
  recompute("full");
  if (p.attention != AttentionKind::flash)
    out.push_back({"--attention flash", ChangeCost::more_compute,
                   [](RunConfig& c) { c.policy.attention = AttentionKind::flash; }, "", "attention"});
  if (p.precision == Precision::fp32)
    out.push_back({"--precision bf16", ChangeCost::lower_precision,
                   [](RunConfig& c) { c.policy.precision = Precision::bf16; }, "", "precision"});
  if (p.optimizer != OptimizerKind::adamw8bit)
    out.push_back({"--optimizer adamw8bit", ChangeCost::lower_precision,
                   [](RunConfig& c) { c.policy.optimizer = OptimizerKind::adamw8bit; }, "", "optimizer"});
  if ((p.lora.enabled() || !p.freeze.empty()) && !p.quantize_base.enabled())
    out.push_back({"--quantize-base nf4 --double-quant", ChangeCost::lower_precision, apply_nf4,
                   "frozen base weights stored in NF4 (QLoRA)", "quantize"});
  // Host offload saves nothing here (the host tier is the same memory); disk offload does.
  const std::string at = " --offload-dir " + (dir.empty() ? std::string(".") : dir);
  if (p.offload_optimizer != Tier::disk && !p.update_in_backward)
    out.push_back({"--offload-optimizer disk" + at, ChangeCost::more_io,
                   [](RunConfig& c) { c.policy.offload_optimizer = Tier::disk; }, "", "offload"});
  // Stage 3's parameter shards (DeepSpeed's offload_param needs stage 3), alone and with the
  // optimizer: each micro-step reads the shards twice, each step writes them once.
  if (p.zero_stage == 3 && p.offload_params != Tier::disk && !p.update_in_backward) {
    const std::string effect = "parameter shards read from disk twice per micro-step, written once per step";
    out.push_back({"--offload-params disk" + at, ChangeCost::more_io,
                   [](RunConfig& c) { c.policy.offload_params = Tier::disk; }, effect, "offload"});
    if (p.offload_optimizer != Tier::disk)
      out.push_back({"--offload-params disk --offload-optimizer disk" + at, ChangeCost::more_io,
                     [](RunConfig& c) { c.policy.offload_params = c.policy.offload_optimizer = Tier::disk; },
                     effect + "; optimizer state and masters every step", "offload"});
  }
  return out;
}

std::string cost_words(const FitSuggestion& s) {
  switch (s.cost) {
    case ChangeCost::same_math: return "same math";
    case ChangeCost::more_compute: return fmt::format("{:+.0f}% compute", 100.0 * s.extra_compute);
    case ChangeCost::more_communication: return "more communication between the ranks";
    case ChangeCost::lower_precision: return "lower precision";
    case ChangeCost::different_run: return "a different run";
    case ChangeCost::more_io: return "optimizer state and masters read and written on disk every step";
    case ChangeCost::changes_what_trains: return "changes which weights train";
  }
  return "?";
}

class Diagnoser {
 public:
  Diagnoser(const RunConfig& c, const PreparedRun& run, uint64_t budget, const Backend& backend)
      : c_(c), run_(run), budget_(budget), backend_(backend), current_(memory_peak(run.compiled.plan)) {
    base_flops_ = flops_per_token(run.compiled.program, run.policy);
  }

  void suggest(std::vector<FitSuggestion>& out, std::vector<std::string>& unavailable) {
    const Policy& p = run_.policy;
    const int64_t global = p.batch * p.grad_accum;
    classifier_chunks(out);
    // A smaller micro-batch, accumulated to the same global batch.
    for (int64_t b = p.batch - 1; b >= 1; --b) {
      if (global % b != 0) continue;
      if (add(out, with_accumulation(c_, b), accumulation_flags(b), ChangeCost::same_math,
              fmt::format("same global batch ({} sequences per optimizer step)", global), true))
        break;
    }
    const std::vector<Technique> all = techniques(p, c_.topology, c_.offload_dir);
    for (const Technique& t : all) try_technique(out, unavailable, t, ChangeCost::different_run);
    pairs(out);
    smaller_batch(out);
    // Training fewer weights is a different model, not the same one trained another way: it
    // is offered only when nothing that trains every weight fits.
    if (std::none_of(out.begin(), out.end(), [](const FitSuggestion& s) { return s.fits; }))
      for (const Technique& t : adapter_techniques(p)) try_technique(out, unavailable, t, t.cost);
    std::stable_sort(out.begin(), out.end(), [](const FitSuggestion& a, const FitSuggestion& b) {
      if (a.fits != b.fits) return a.fits;
      if (a.cost != b.cost) return a.cost < b.cost;
      if (a.extra_compute != b.extra_compute) return a.extra_compute < b.extra_compute;
      if (a.parts != b.parts) return a.parts < b.parts;
      return a.peak < b.peak;
    });
    keep_cheapest_per_cost(out);
  }

 private:
  // A technique that lowers the peak without fitting alone, kept for the pairs.
  struct Helping {
    Technique technique;
    uint64_t peak;
  };

  RunConfig with_accumulation(RunConfig c, int64_t b) const {
    const int64_t global = run_.policy.batch * run_.policy.grad_accum;
    c.policy.batch = b;
    c.policy.grad_accum = int(global / b);
    return c;
  }
  std::string accumulation_flags(int64_t b) const {
    return fmt::format("--batch {} --grad-accum {}", b, run_.policy.batch * run_.policy.grad_accum / b);
  }

  // The technique alone; when it helps without fitting, with accumulation keeping the global
  // batch, and with the largest batch that then fits (as `smaller_batch_cost`, the change a
  // smaller global batch makes).
  void try_technique(std::vector<FitSuggestion>& out, std::vector<std::string>& unavailable, const Technique& t,
                     ChangeCost smaller_batch_cost) {
    const Policy& p = run_.policy;
    RunConfig c = c_;
    t.apply(c);
    const std::string flags = t.flags + make_runnable(c, run_.spec, backend_);
    const CandidatePlan cand = plan_candidate(c, backend_);
    if (!cand.built) {
      if (cand.unsupported) unavailable.push_back(t.flags);
      return;
    }
    if (add(out, c, flags, t.cost, t.effect, false, &cand)) return;
    if (cand.peak >= current_) return;
    if (t.cost != ChangeCost::changes_what_trains) helping_.push_back({t, cand.peak});
    if (p.batch <= 1) return;
    with_smaller_micro_batch(out, c, flags, t.cost, t.effect);
    const int64_t b = largest_fitting_batch(c, backend_, budget_, p.batch - 1);
    const std::string effect = fmt::format("global batch {} instead of {} sequences", b * p.grad_accum,
                                           p.batch * p.grad_accum);
    if (b >= 1)
      add(out, with_batch(c, b), fmt::format("{} --batch {}", flags, b), smaller_batch_cost,
          t.effect.empty() ? effect : t.effect + "; " + effect, true, nullptr, 2);
  }

  // `c` (a change that helps) with the largest micro-batch, among the divisors of the global
  // batch below the current one, that then fits; the global batch is kept. The divisors are
  // searched by bisection: a smaller micro-batch never needs more memory.
  void with_smaller_micro_batch(std::vector<FitSuggestion>& out, const RunConfig& c, const std::string& flags,
                                ChangeCost cost, const std::string& effect) {
    const int64_t global = run_.policy.batch * run_.policy.grad_accum;
    std::vector<int64_t> divisors;
    for (int64_t b = 1; b < run_.policy.batch; ++b)
      if (global % b == 0) divisors.push_back(b);
    FitSearch search([&](int64_t i) {
      const CandidatePlan cand = plan_candidate(with_accumulation(c, divisors[size_t(i - 1)]), backend_);
      return cand.built && cand.peak <= budget_;
    });
    const int64_t i = search.largest(1, int64_t(divisors.size()));
    if (i < 1) return;
    const int64_t b = divisors[size_t(i - 1)];
    const std::string keeps = fmt::format("same global batch ({} sequences per optimizer step)", global);
    add(out, with_accumulation(c, b), flags + " " + accumulation_flags(b), cost,
        effect.empty() ? keeps : effect + "; " + keeps, true, nullptr, 2, true);
  }

  // Two techniques that each help without fitting alone, together; only the pairs that fit are
  // shown, at the cost of their dearer part.
  void pairs(std::vector<FitSuggestion>& out) {
    for (size_t i = 0; i < helping_.size(); ++i)
      for (size_t j = i + 1; j < helping_.size(); ++j) {
        const Technique& a = helping_[i].technique;
        const Technique& b = helping_[j].technique;
        if (a.knob == b.knob) continue;
        RunConfig c = c_;
        a.apply(c);
        b.apply(c);
        std::string effect = a.effect;
        if (!b.effect.empty()) effect += (effect.empty() ? "" : "; ") + b.effect;
        add(out, c, a.flags + " " + b.flags, std::max(a.cost, b.cost), effect, true, nullptr, 2, true);
      }
  }

  // A smaller global batch; with batch 1 not fitting either, shorter sequences.
  void smaller_batch(std::vector<FitSuggestion>& out) {
    const Policy& p = run_.policy;
    const int64_t global = p.batch * p.grad_accum;
    const int64_t b = p.batch > 1 ? largest_fitting_batch(c_, backend_, budget_, p.batch - 1) : 0;
    if (b >= 1) {
      add(out, with_batch(c_, b), fmt::format("--batch {}", b), ChangeCost::different_run,
          fmt::format("global batch {} instead of {} sequences", b * p.grad_accum, global), true);
    } else if (p.seq > 1) {
      RunConfig c = with_batch(c_, 1);
      FitSearch search([&](int64_t t) {
        c.policy.seq = t;
        const CandidatePlan cand = plan_candidate(c, backend_);
        return cand.built && cand.peak <= budget_;
      });
      const int64_t t = search.largest(1, p.seq - 1);
      c.policy.seq = t;
      if (t >= 1)
        add(out, c, fmt::format("--batch 1 --seq {}", t), ChangeCost::different_run,
            fmt::format("sequences of {} tokens instead of {}", t, p.seq), true);
    }
  }

  // Sorted `out`: at most kShownPerCost fitting suggestions per cost class.
  static void keep_cheapest_per_cost(std::vector<FitSuggestion>& out) {
    std::map<ChangeCost, size_t> shown;
    std::erase_if(out, [&](const FitSuggestion& s) { return s.fits && ++shown[s.cost] > kShownPerCost; });
  }

  // Smaller logits chunks: the largest multiple of 16 rows that fits.
  void classifier_chunks(std::vector<FitSuggestion>& out) {
    const int64_t rows = classifier_chunk_rows(run_.spec, run_.policy);
    if (rows <= 16) return;
    RunConfig c = c_;
    FitSearch search([&](int64_t m) {
      c.policy.classifier_chunk_rows = 16 * m;
      const CandidatePlan cand = plan_candidate(c, backend_);
      return cand.built && cand.peak <= budget_;
    });
    const int64_t m = search.largest(1, (rows - 1) / 16);
    c.policy.classifier_chunk_rows = 16 * std::max<int64_t>(m, 1);
    add(out, c, fmt::format("--classifier-chunk {}", c.policy.classifier_chunk_rows), ChangeCost::same_math,
        fmt::format("logits in chunks of {} rows instead of {}", c.policy.classifier_chunk_rows, rows), m >= 1);
  }

  // Plans `c` (unless given: then `c` and `flags` are already runnable) and records it when it
  // fits, or (when !only_if_fits) when it at least lowers the peak. `parts`: the changes it
  // combines; `say_compute`: name the combined extra compute in the effect. Returns whether it
  // fits.
  bool add(std::vector<FitSuggestion>& out, RunConfig c, std::string flags, ChangeCost cost, std::string effect,
           bool only_if_fits, const CandidatePlan* planned = nullptr, int parts = 1, bool say_compute = false) {
    if (!planned) flags += make_runnable(c, run_.spec, backend_);
    const CandidatePlan cand = planned ? *planned : plan_candidate(c, backend_);
    if (!cand.built) return false;
    const bool fits = cand.peak <= budget_;
    if (!fits && (only_if_fits || cand.peak >= current_)) return false;
    FitSuggestion s;
    s.flags = std::move(flags);
    s.effect = std::move(effect);
    s.cost = cost;
    s.parts = parts;
    s.extra_compute = base_flops_ > 0 ? cand.flops_per_token / base_flops_ - 1.0 : 0.0;
    if (s.cost == ChangeCost::more_compute && (s.effect.empty() || say_compute))
      s.effect = s.effect.empty() ? cost_words(s) : cost_words(s) + "; " + s.effect;
    s.peak = cand.peak;
    s.fits = fits;
    out.push_back(std::move(s));
    return fits;
  }

  const RunConfig& c_;
  const PreparedRun& run_;
  uint64_t budget_;
  const Backend& backend_;
  uint64_t current_;
  double base_flops_ = 0;
  std::vector<Helping> helping_;
};

}  // namespace

BudgetDiagnosis diagnose_budget(const RunConfig& c, const PreparedRun& run, uint64_t budget, const Backend& backend) {
  const Program& p = run.compiled.program;
  const MemoryPlan& plan = run.compiled.plan;
  const TierPlan& t = plan.tier(Tier::device);
  BudgetDiagnosis d;
  d.budget = budget;
  d.peak = memory_peak(plan);
  d.peak_op = t.peak_op;
  for (Category cat : kAllCategories)
    if (t.at_peak[size_t(cat)] > t.at_peak[size_t(d.largest_category)]) d.largest_category = cat;
  d.live_at_peak = live_tensors_at(p, plan, planned_buffers(p, plan), Tier::device, t.peak_op);
  Diagnoser(c, run, budget, backend).suggest(d.suggestions, d.unavailable);

  const uint64_t over = d.peak > budget ? d.peak - budget : 0;
  std::string& r = d.report;
  r += fmt::format("  budget        {:>12} ({} bytes), {}\n", format_bytes(budget), budget,
                   plan.tier(Tier::host).peak_bytes > 0 ? "device and host tiers (both this machine's memory)" : "device tier");
  r += fmt::format("  planned peak  {:>12} ({} bytes): {} ({} bytes) over\n", format_bytes(d.peak), d.peak,
                   format_bytes(over), over);
  if (d.peak_op >= 0) {
    const Op& op = p.op(d.peak_op);
    r += fmt::format("  peak at op {} '{}' ({}, {}{})\n", d.peak_op, op.name, op_kind_name(op.kind), phase_name(op.phase),
                     op.layer >= 0 ? fmt::format(", layer {}", op.layer) : "");
  }
  r += "  at the peak:";
  std::vector<Category> order(kAllCategories.begin(), kAllCategories.end());
  std::stable_sort(order.begin(), order.end(),
                   [&](Category a, Category b) { return t.at_peak[size_t(a)] > t.at_peak[size_t(b)]; });
  for (Category cat : order)
    if (t.at_peak[size_t(cat)] > 0) r += fmt::format(" {} {},", category_name(cat), format_bytes(t.at_peak[size_t(cat)]));
  r += fmt::format(" free (holes) {}\n", format_bytes(t.free_at_peak));
  r += "  largest tensors live at the peak:\n";
  for (size_t i = 0; i < std::min(kTensorsShown, d.live_at_peak.size()); ++i)
    r += fmt::format("    {:>12}  {}\n", format_bytes(d.live_at_peak[i].bytes), describe_live_tensor(p, d.live_at_peak[i]));
  // Suggestions are sorted with the fitting ones first.
  const size_t fitting = size_t(
      std::count_if(d.suggestions.begin(), d.suggestions.end(), [](const FitSuggestion& s) { return s.fits; }));
  size_t width = 34;
  for (const FitSuggestion& s : d.suggestions) width = std::max(width, s.flags.size());
  for (size_t i = 0; i < d.suggestions.size(); ++i) {
    if (i == 0 && fitting > 0)
      r += "  changes that make it fit (each built and planned; cheapest first; append one to the command):\n";
    if (i == fitting) r += "  changes that help but are not enough alone:\n";
    const FitSuggestion& s = d.suggestions[i];
    r += fmt::format("    {:<{}} peak {:>11}, saves {:>11}   {}\n", s.flags, width, format_bytes(s.peak),
                     format_bytes(d.peak - std::min(d.peak, s.peak)), s.effect.empty() ? cost_words(s) : s.effect);
  }
  if (fitting == 0) {
    uint64_t persistent = 0;
    for (const LiveTensor& lt : d.live_at_peak) persistent += lt.persistent ? lt.bytes : 0;
    r += d.suggestions.empty() ? "  no change found that fits or helps"
                               : "  no change, nor any pair of the ones above, found that fits";
    r += fmt::format(" (the persistent tensors alone, parameters and optimizer state, take {})\n",
                     format_bytes(persistent));
  }
  if (!d.unavailable.empty()) {
    r += "  not available in this build:";
    for (const std::string& u : d.unavailable) r += " " + u + (&u == &d.unavailable.back() ? "" : ",");
    r += "\n";
  }

  const Op* op = d.peak_op >= 0 ? &p.op(d.peak_op) : nullptr;
  d.summary = fmt::format("the run needs {} {} but the budget is {} ({} over); the peak is at op '{}' "
                          "({}), where {} is the largest category with {}",
                          format_bytes(d.peak),
                          plan.tier(Tier::host).peak_bytes > 0 ? "on the device and host tiers" : "on the device tier",
                          format_bytes(budget), format_bytes(over), op ? op->name : "?",
                          op ? phase_name(op->phase) : "?", category_name(d.largest_category),
                          format_bytes(t.at_peak[size_t(d.largest_category)]));
  if (fitting > 0)
    d.summary += fmt::format("; cheapest change that fits: {} (peak {}); details above", d.suggestions[0].flags,
                             format_bytes(d.suggestions[0].peak));
  else
    d.summary += "; no single change or pair of changes fits (details above)";
  return d;
}

void enforce_memory_budget(const RunConfig& c, const PreparedRun& run, uint64_t budget, const Backend& backend,
                           std::ostream& log) {
  if (memory_peak(run.compiled.plan) <= budget) return;
  const BudgetDiagnosis d = diagnose_budget(c, run, budget, backend);
  log << "memory budget exceeded: the run stops before step 1\n" << d.report << std::flush;
  throw Error("plan", d.summary);
}

}  // namespace memfit
