#include "fit/fit_search.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <map>
#include <optional>
#include <tuple>

#include "core/bytes.hpp"
#include "core/error.hpp"
#include "fit/lora_breakdown.hpp"
#include "graph/precision.hpp"
#include "graph/recompute.hpp"

namespace memfit {

namespace {

// Micro-steps per optimizer step for micro-batch b on a number of data-parallel replicas.
using Accumulation = std::function<int(int64_t b, int data_ranks)>;

struct StateChoice {
  int zero;
  Tier optimizer, params;
};

std::vector<StateChoice> state_choices(int world) {
  // DeepSpeed's constraints: offloading the optimizer needs a ZeRO stage, NVMe and parameter
  // offload need stage 3. On one rank the stages differ only by offload.
  if (world == 1)
    return {{0, Tier::device, Tier::device}, {2, Tier::host, Tier::device}, {3, Tier::host, Tier::host},
            {3, Tier::disk, Tier::disk}};
  return {{0, Tier::device, Tier::device}, {1, Tier::device, Tier::device}, {2, Tier::device, Tier::device},
          {3, Tier::device, Tier::device}, {2, Tier::host, Tier::device},   {3, Tier::host, Tier::device},
          {3, Tier::host, Tier::host},     {3, Tier::disk, Tier::disk}};
}

RecomputePolicy recompute_level(int level, AttentionKind attention) {
  switch (level) {
    case 0: return parse_recompute("none");
    case 1: return parse_recompute(attention == AttentionKind::plain ? "selective:attention" : "selective:mlp_activation,norms");
    default: return parse_recompute("full");
  }
}

// The base policy with a family's key: precision (gradients in the same 16 bits, or fp32),
// attention, recomputation level and optimizer.
Policy family_key(const Policy& base, Precision prec, AttentionKind attn, int level, OptimizerKind opt) {
  Policy p = base;
  p.precision = prec;
  p.grad_dtype = compute_dtype(prec);
  p.fp32_ops.clear();
  p.attention = attn;
  p.recompute = recompute_level(level, attn);
  p.optimizer = opt;
  return p;
}

// What the planned program depends on; then the ZeRO stage and world size of a rank program (0
// and 1: the unsharded program); LoRA's rank, DoRA, and the base's quantisation (proposed when nothing
// else fits); last the tensor-parallel degree.
using ProgramKey =
    std::tuple<Precision, AttentionKind, int, OptimizerKind, int64_t, bool, int, int, int64_t, bool, BaseQuant, int>;

class Planner {
 public:
  Planner(const ModelSpec& spec, const Hardware& hw, const EstimateOptions& o, int world)
      : spec_(spec), hw_(hw), o_(o), world_(world) {}
  // The unsharded program (the FLOPs bound, and the analytic sharding of offload families).
  const ProgramSummary& summary(const Policy& p, int level) { return lookup(p, level, 0, 1, 1); }
  // What the family's estimate starts from: rank 0's own program of the world at its stage
  // where the builder expresses the policy (always under tensor parallelism), else the
  // unsharded program.
  const ProgramSummary& for_estimate(const Policy& p, int level, int tensor = 1) {
    if (!zero_from_program(p, world_) && tensor == 1) return summary(p, level);
    return lookup(p, level, p.zero_stage, world_, tensor);
  }
  int planned() const { return planned_; }

 private:
  const ProgramSummary& lookup(const Policy& p, int level, int stage, int world, int tensor) {
    const ProgramKey key{p.precision, p.attention, level,      p.optimizer,        p.batch,
                         p.grad_accum > 1, stage, world, p.lora.rank, p.lora.dora, p.quantize_base.kind, tensor};
    auto it = cache_.find(key);
    if (it != cache_.end()) return it->second;
    Policy q = p;
    q.grad_accum = p.grad_accum > 1 ? 2 : 1;  // memory and per-micro work are the same for every k > 1
    q.zero_stage = stage;
    ProgramSummary s;
    if (stage == 0 && world == 1 && tensor == 1) {
      s = plan_summary(spec_, q, hw_, o_);
    } else {
      // Only the unsharded model-state elements are taken from it: the same at every micro-batch.
      Policy one = p;
      one.batch = 1;
      s = plan_rank_summary(spec_, q, world, hw_, o_, summary(one, level), tensor);
    }
    ++planned_;
    return cache_.emplace(key, std::move(s)).first->second;
  }

  const ModelSpec& spec_;
  const Hardware& hw_;
  const EstimateOptions& o_;
  int world_;
  std::map<ProgramKey, ProgramSummary> cache_;
  int planned_ = 0;
};

}  // namespace

std::optional<DeepSpeedStep> fit_deepspeed_step(const Policy& p, int world, const FitOptions& o, std::string& why) {
  std::optional<DeepSpeedStep> st = deepspeed_step_for(p, world, std::nullopt, why);
  if (!st) return st;
  const int stage = st->zero.stage;
  st->zero = o.deepspeed_zero;
  st->zero.stage = stage;
  st->torch_adam = o.deepspeed_torch_adam;
  return st;
}

namespace {

// Whether a candidate fits, and the bytes that decided it: memfit's plan of it (the largest
// rank's, fixed runtime bytes included), or the predicted PyTorch peak of the same step (on CUDA its
// predicted reserve, torch.cuda.max_memory_reserved) plus the same fixed runtime bytes (the
// framework's context and workspaces are no tensors either way).
class Judge {
 public:
  Judge(const ModelSpec& spec, const Cluster& cluster, uint64_t budget, const FitOptions& o)
      : spec_(spec), cluster_(cluster), budget_(budget), o_(o) {}
  uint64_t budget() const { return budget_; }
  // Why the framework's prediction does not cover the family; empty when it does.
  std::string refuses(const Policy& p) const {
    if (o_.framework == FitFramework::memfit) return "";
    // The same attention as asked, and a step the prediction covers (it throws otherwise).
    auto covered = [&](TorchAttention attention, const auto& predict) -> std::string {
      if (o_.torch_attention && attention != *o_.torch_attention)
        return fmt::format("attention other than --torch-attention {}", torch_attention_name(*o_.torch_attention));
      try {
        predict();
      } catch (const Error& e) {
        return e.what();
      }
      return "";
    };
    std::string why;
    if (o_.framework == FitFramework::deepspeed) {
      const std::optional<DeepSpeedStep> d = fit_deepspeed_step(p, cluster_.world_size(), o_, why);
      if (!d) return why;
      return covered(d->torch.attention, [&] { predict_deepspeed_peak(spec_, *d); });
    }
    const std::optional<TorchStep> st = torch_step_for(p, cluster_.world_size(), std::nullopt, why);
    if (!st) return why;
    return covered(st->attention, [&] { predict_pytorch_peak(spec_, on_hardware(*st, cluster_.hw)); });
  }
  uint64_t bytes(const Policy& q, const RankEstimate& e) const {
    if (o_.framework == FitFramework::memfit) return e.device_bytes_of_largest_rank();
    if (o_.framework == FitFramework::deepspeed) return ds_peak(q).peak + torch_runtime_bytes(cluster_);
    return pytorch_device_bytes(torch_peak(q)) + torch_runtime_bytes(cluster_);
  }
  uint64_t framework_bytes(const Policy& q, const RankEstimate& e) const {
    return o_.framework == FitFramework::memfit ? 0 : bytes(q, e);
  }
  Overflow check(const Policy& q, const RankEstimate& e) const {
    if (o_.framework == FitFramework::memfit) return check_fit(e, cluster_, budget_);
    if (o_.framework == FitFramework::deepspeed) {
      const DeepSpeedPeak d = ds_peak(q);
      Overflow o;
      const uint64_t need = d.peak + torch_runtime_bytes(cluster_);
      if (need <= budget_) return o;
      o.excess = need - budget_;
      const std::pair<uint64_t, Category> parts[] = {{d.parameters, Category::parameters},
                                                     {d.master + d.optimizer_state, Category::optimizer_state},
                                                     {d.gradients, Category::gradients},
                                                     {d.buckets, Category::communication},
                                                     {d.activations, Category::activations}};
      o.category = std::max_element(std::begin(parts), std::end(parts))->second;
      return o;
    }
    const TorchPeak t = torch_peak(q);
    Overflow o;
    const uint64_t need = pytorch_device_bytes(t) + torch_runtime_bytes(cluster_);  // the reserve on CUDA
    if (need <= budget_) return o;
    o.excess = need - budget_;
    const std::pair<uint64_t, Category> parts[] = {{t.parameters, Category::parameters},
                                                   {t.optimizer_state, Category::optimizer_state},
                                                   {t.gradients, Category::gradients},
                                                   {t.saved_activations, Category::activations},
                                                   {t.transient, Category::temporaries}};
    o.category = std::max_element(std::begin(parts), std::end(parts))->second;
    return o;
  }

 private:
  DeepSpeedPeak ds_peak(const Policy& q) const {
    std::string why;
    std::optional<DeepSpeedStep> st = fit_deepspeed_step(q, cluster_.world_size(), o_, why);
    MEMFIT_ASSERT(st.has_value(), "a refused family was searched: {}", why);
    st->torch = on_hardware(st->torch, cluster_.hw);
    return predict_deepspeed_peak(spec_, *st);
  }
  TorchPeak torch_peak(const Policy& q) const {
    std::string why;
    const std::optional<TorchStep> st = torch_step_for(q, cluster_.world_size(), std::nullopt, why);
    MEMFIT_ASSERT(st.has_value(), "a refused family was searched: {}", why);
    return predict_pytorch_peak(spec_, on_hardware(*st, cluster_.hw));
  }

  const ModelSpec& spec_;
  const Cluster& cluster_;
  uint64_t budget_;
  const FitOptions& o_;
};

// The family's largest fitting micro-batch: guessed from the growth between 1 and 2, then
// checked. A family that does not fit at micro-batch 1 is recorded in `r.rejected`, one the
// judge's framework does not cover in `r.skipped`.
std::optional<FitCandidate> search_family(Planner& planner, const Policy& f, int level, const Cluster& cluster,
                                          const EstimateOptions& eo, const Judge& judge, int64_t max_batch,
                                          int64_t global_batch, const Accumulation& accumulation,
                                          FitResult& r, int tensor = 1) {
  const int D = cluster.world_size() / tensor;  // data-parallel replicas
  if (const std::string why = judge.refuses(f); !why.empty()) {
    ++r.skipped[why];
    return std::nullopt;
  }
  const double budget = double(judge.budget());
  auto estimate_at = [&](int64_t b) {
    Policy q = f;
    q.batch = b;
    q.grad_accum = accumulation(b, D);
    return std::pair{q, estimate_from_summary(planner.for_estimate(q, level, tensor), q, cluster, eo)};
  };
  auto fits = [&](int64_t b) {
    const auto [q, e] = estimate_at(b);
    return judge.check(q, e).fits();
  };
  const auto [q1, e1] = estimate_at(1);
  const Overflow o1 = judge.check(q1, e1);
  const std::string tp = tensor_parallel_label(tensor, f);
  if (!o1.fits()) {
    r.rejected.push_back({family_name(f) + tp, o1});
    return std::nullopt;
  }
  int64_t b = 1;
  if (max_batch > 1 && fits(2)) {
    const auto [q2, e2] = estimate_at(2);
    const double bytes1 = double(judge.bytes(q1, e1));
    const double slope = std::max(1.0, double(judge.bytes(q2, e2)) - bytes1);
    b = std::clamp<int64_t>(1 + int64_t((budget - bytes1) / slope), 2, max_batch);
    for (int tries = 0; b > 2 && !fits(b) && tries < 8; ++tries) b = std::max<int64_t>(2, b * 9 / 10);
    while (b > 2 && !fits(b)) --b;
    for (int tries = 0; b < max_batch && tries < 2 && fits(b + 1); ++tries) ++b;
  }
  // A global batch is kept exactly: the micro-batch divides each rank's share of it.
  if (global_batch)
    while ((global_batch / D) % b != 0) --b;
  auto [q, e] = estimate_at(b);
  return FitCandidate{q, e, family_name(q) + tp, false, 0, tensor};
}

// The search planned rank 0; the winners are planned on every rank (their pieces of the
// buckets differ by a few KiB) and step their micro-batch down where another rank does not fit.
std::vector<FitCandidate> plan_winners_on_every_rank(std::vector<FitCandidate> found, const ModelSpec& spec,
                                                     const Cluster& cluster, const EstimateOptions& eo, const Judge& judge,
                                                     int64_t global_batch, const Accumulation& accumulation,
                                                     int& rank_plans) {
  std::vector<FitCandidate> checked;
  for (FitCandidate& f : found) {
    const int D = cluster.world_size() / f.tensor;
    plan_every_rank(spec, f.policy, cluster, eo, f.estimate, kMaxRanksPlanned, f.tensor);
    while (!judge.check(f.policy, f.estimate).fits() && f.policy.batch > 1) {
      int64_t b = f.policy.batch - 1;
      if (global_batch)
        while ((global_batch / D) % b != 0) --b;
      f.policy.batch = b;
      f.policy.grad_accum = accumulation(b, D);
      f.estimate = estimate_run(spec, f.policy, cluster, eo, f.tensor);
      plan_every_rank(spec, f.policy, cluster, eo, f.estimate, kMaxRanksPlanned, f.tensor);
    }
    rank_plans += f.estimate.ranks_planned - 1;
    if (!judge.check(f.policy, f.estimate).fits()) continue;
    f.framework_bytes = judge.framework_bytes(f.policy, f.estimate);
    checked.push_back(std::move(f));
  }
  return checked;
}

// Nothing that trains every weight fits on the device alone (without offload): LoRA on every
// linear layer, then also on a 4-bit base, each whole or (several ranks) sharded by ZeRO-3 as
// FSDP-QLoRA does, may. They change what trains, so they are searched only then, listed after
// every family that trains the model as asked, and labelled.
void propose_lora(Planner& planner, const Policy& base, const Cluster& cluster, const EstimateOptions& eo,
                  const Judge& judge, int64_t max_batch, int64_t global_batch,
                  const Accumulation& accumulation, FitResult& r, std::vector<FitCandidate>& found) {
  for (int stage : {0, 3})
    for (bool quantised : {false, true})
      for (int level : {0, 2}) {
        if (stage == 3 && cluster.world_size() == 1) continue;
        Policy f = base;
        f.precision = native_half_precision(cluster.hw), f.grad_dtype = compute_dtype(f.precision);
        f.fp32_ops.clear();
        f.attention = AttentionKind::flash;
        f.recompute = recompute_level(level, f.attention);
        f.optimizer = OptimizerKind::adamw;
        f.zero_stage = stage;
        f.offload_optimizer = f.offload_params = Tier::device;
        f.freeze.clear();
        f.lora = LoraPolicy{};
        f.lora.rank = kProposedLoraRank;
        f.lora.targets = {"all-linear"};
        if (quantised) {
          f.quantize_base.kind = BaseQuant::nf4;
          f.quantize_base.double_quant = true;
        }
        f.batch = 1;
        f.grad_accum = accumulation(1, cluster.world_size());
        ++r.families;
        if (auto c = search_family(planner, f, level, cluster, eo, judge, max_batch, global_batch, accumulation, r)) {
          c->changes_training = true;
          found.push_back(std::move(*c));
        }
      }
}

// Tensor parallelism (Megatron-LM) inside a node: each T of 2, 4, 8 dividing the node, the world
// and the model, with sequence parallelism and ZeRO 0-3 over the world / T replicas, on the
// device; memfit's runs (LoRA too). Not pruned: the FLOP bound counts one rank's tokens.
void search_tensor_parallel(const ModelSpec& spec, const Policy& base, Planner& planner, const Cluster& cluster,
                            const EstimateOptions& eo, const Judge& judge, int64_t max_batch, const FitOptions& options,
                            const Accumulation& accumulation, FitResult& r, std::vector<FitCandidate>& found) {
  // Not yet: a quantised base with tensor parallelism; --freeze's ZeRO is modelled, not planned.
  if (!options.search_tensor_parallel || options.framework != FitFramework::memfit || base.quantize_base.enabled() ||
      !base.freeze.empty())
    return;
  const int W = cluster.world_size();
  for (int t : {2, 4, 8}) {
    if (cluster.gpus_per_node % t != 0 || W % t != 0 || spec.n_head % t != 0 || spec.n_kv_head % t != 0 ||
        spec.n_inner % t != 0 || spec.padded_vocab % t != 0)
      continue;
    const std::vector<int> stages = W / t == 1 ? std::vector<int>{0} : std::vector<int>{0, 1, 2, 3};
    for (Precision prec : {native_half_precision(cluster.hw), Precision::fp32})
      for (AttentionKind attn : {AttentionKind::flash, AttentionKind::plain})
        for (int level = 0; level < 3; ++level)
          for (int stage : stages) {
            Policy f = family_key(base, prec, attn, level, OptimizerKind::adamw);
            f.zero_stage = stage;
            f.offload_optimizer = f.offload_params = Tier::device;
            f.sequence_parallel = true;  // never more memory; its gathers repeat in the backward
            f.batch = 1;
            f.grad_accum = accumulation(1, W / t);
            ++r.families;
            if (auto c = search_family(planner, f, level, cluster, eo, judge, max_batch, options.global_batch,
                                       accumulation, r, t))
              found.push_back(std::move(*c));
          }
  }
}

}  // namespace

std::string tensor_parallel_label(int tensor, const Policy& p) {
  return tensor > 1 ? fmt::format(" tensor={}{}", tensor, p.sequence_parallel ? "+sequence" : "") : "";
}

std::string family_name(const Policy& p) {
  std::string offload = "none";
  if (p.offload_optimizer != Tier::device) offload = fmt::format("optimizer:{}", tier_name(p.offload_optimizer));
  if (p.offload_params != Tier::device) offload += fmt::format(",params:{}", tier_name(p.offload_params));
  std::string lora;
  if (p.lora.enabled())
    lora = fmt::format(" lora=r{}:{}{}", p.lora.rank, p.lora.target_regex.empty() ? fmt::format("{}", fmt::join(
                       p.lora.targets, ",")) : p.lora.target_regex, p.lora.dora ? "+dora" : "");
  if (p.quantize_base.enabled())
    lora += fmt::format(" base={}{}", base_quant_name(p.quantize_base.kind), p.quantize_base.double_quant ? "+dq" : "");
  return fmt::format("{} {} recompute={} {} zero={} offload={}{}", precision_name(p.precision), attention_name(p.attention),
                     p.recompute.to_string(), optimizer_name(p.optimizer), p.zero_stage, offload, lora);
}

uint64_t usable_bytes(uint64_t budget, double headroom) {
  MEMFIT_CHECK(headroom >= 0 && headroom < 1, "fit", "the headroom must be a share of memory in [0, 1) (got {})",
               headroom);
  return uint64_t(std::floor(double(budget) * (1.0 - headroom)));
}

FitComplexity fit_complexity(const Policy& p) {
  const RecomputeMode m = p.recompute.mode;
  const int recompute = m == RecomputeMode::none ? 0 : m == RecomputeMode::selective ? 1 : 2;
  return {int(p.offload_params),
          int(p.offload_optimizer),
          p.optimizer == OptimizerKind::adamw8bit ? 1 : 0,
          p.zero_stage,
          recompute,
          p.precision == Precision::fp32 ? 0 : 1,
          p.attention == AttentionKind::flash ? 1 : 0};
}

void rank_candidates(std::vector<FitCandidate>& candidates, double tolerance) {
  MEMFIT_CHECK(tolerance >= 0, "fit", "the tie tolerance must not be negative (got {})", tolerance);
  std::vector<FitCandidate> rest = std::move(candidates), ranked;
  // A total order, unlike "faster unless within 5%" (not transitive): the fastest remaining
  // sets the bar, the simplest that clears it goes next.
  std::stable_sort(rest.begin(), rest.end(), [](const FitCandidate& a, const FitCandidate& b) {
    if (a.changes_training != b.changes_training) return b.changes_training;
    return a.estimate.tokens_per_second > b.estimate.tokens_per_second;
  });
  while (!rest.empty()) {
    const FitCandidate& fastest = rest.front();
    size_t pick = 0;
    for (size_t i = 1; i < rest.size(); ++i) {
      const FitCandidate& c = rest[i];
      if (c.changes_training != fastest.changes_training) break;
      // The fastest keeps its place only when it gains the tolerance or more over c.
      if (fastest.estimate.tokens_per_second >= (1.0 + tolerance) * c.estimate.tokens_per_second) break;
      // Tensor parallelism first: a near-tie goes to the data-parallel layout.
      const auto simpler = [](const FitCandidate& x) { return std::pair{x.tensor, fit_complexity(x.policy)}; };
      if (simpler(c) < simpler(rest[pick])) pick = i;
    }
    ranked.push_back(std::move(rest[pick]));
    rest.erase(rest.begin() + std::ptrdiff_t(pick));
  }
  candidates = std::move(ranked);
}

FitResult fit_search(const ModelSpec& spec, const Policy& base, const Cluster& cluster, const EstimateOptions& eo,
                     const FitOptions& options) {
  const auto start = std::chrono::steady_clock::now();
  FitResult r;
  r.budget = options.budget ? options.budget : cluster.hw.memory_bytes;
  r.headroom = options.headroom;
  r.tie_tolerance = options.tie_tolerance;
  r.usable = usable_bytes(r.budget, options.headroom);
  r.framework = options.framework;
  const Judge judge(spec, cluster, r.usable, options);  // every candidate is checked against r.usable
  const int W = cluster.world_size();
  MEMFIT_CHECK(options.max_batch >= 1, "fit", "the largest micro-batch must be at least 1 (got {})", options.max_batch);
  MEMFIT_CHECK(options.global_batch == 0 || options.global_batch % W == 0, "fit",
               "a global batch of {} sequences does not split evenly over {} ranks", options.global_batch, W);
  const int64_t max_batch = options.global_batch ? std::min(options.max_batch, options.global_batch / W) : options.max_batch;
  const Accumulation accumulation = [&](int64_t b, int data_ranks) {
    return options.global_batch ? int((options.global_batch + b * data_ranks - 1) / (b * data_ranks)) : base.grad_accum;
  };

  Planner planner(spec, cluster.hw, eo, W);
  std::vector<FitCandidate> found;
  double best_per_token = 0;  // seconds per token per rank of the keep-th best so far (0: none yet)
  auto kth_best = [&]() {
    if (int(found.size()) < options.keep) return 0.0;
    std::vector<double> t;
    for (const FitCandidate& c : found)
      t.push_back(c.estimate.step_seconds / (double(c.policy.batch) * double(c.policy.seq) * c.policy.grad_accum));
    std::nth_element(t.begin(), t.begin() + options.keep - 1, t.end());
    return t[size_t(options.keep - 1)];
  };

  // Fastest-looking keys first, so pruning bites early.
  const Precision half = native_half_precision(cluster.hw);
  for (Precision prec : {half, Precision::fp32})
    for (AttentionKind attn : {AttentionKind::flash, AttentionKind::plain})
      for (int level = 0; level < 3; ++level)
        for (OptimizerKind opt : {OptimizerKind::adamw, OptimizerKind::adamw8bit}) {
          Policy p = family_key(base, prec, attn, level, opt);
          p.batch = 1;
          p.grad_accum = accumulation(1, W);
          std::vector<StateChoice> choices;
          // An offloaded optimizer runs on the host's cores as fp32 AdamW (DeepSpeed's CPU
          // Adam); 8-bit state stays on the device.
          for (const StateChoice& sc : state_choices(W))
            if (opt == OptimizerKind::adamw || sc.optimizer == Tier::device) choices.push_back(sc);
          r.families += int(choices.size());
          // Lower bound on seconds per token per rank: FLOPs at the efficiency of peak (the
          // FLOPs are the same in every precision, so the 16-bit twin's plan gives them).
          best_per_token = kth_best();
          if (best_per_token > 0) {
            const ProgramSummary& t = planner.summary(family_key(p, half, attn, level, opt), level);
            const double bound = (t.micro_flops + t.recompute_flops) / double(p.seq) /
                                 (cluster.hw.peak_flops(compute_dtype(prec)) * eo.efficiency);
            // A slower key can still rank above the k-th best if it is simpler and within
            // the tie tolerance of it.
            if (bound > best_per_token * (1.0 + options.tie_tolerance)) {
              r.pruned += int(choices.size());
              continue;
            }
          }
          for (const StateChoice& sc : choices) {
            Policy f = p;
            f.zero_stage = sc.zero;
            f.offload_optimizer = sc.optimizer;
            f.offload_params = sc.params;
            if (auto c = search_family(planner, f, level, cluster, eo, judge, max_batch, options.global_batch,
                                       accumulation, r))
              found.push_back(std::move(*c));
          }
        }
  search_tensor_parallel(spec, base, planner, cluster, eo, judge, max_batch, options, accumulation, r, found);
  // Candidates that train what was asked first, then (labelled) those that train LoRA instead.
  rank_candidates(found, options.tie_tolerance);
  if (int(found.size()) > options.keep) found.resize(size_t(options.keep));
  const bool on_device = std::any_of(found.begin(), found.end(), [](const FitCandidate& c) {
    return c.policy.offload_optimizer == Tier::device && c.policy.offload_params == Tier::device;
  });
  if (!on_device && !has_lora_or_quantised_base(base)) {
    std::vector<FitCandidate> lora;
    propose_lora(planner, base, cluster, eo, judge, max_batch, options.global_batch, accumulation, r, lora);
    rank_candidates(lora, options.tie_tolerance);
    if (int(lora.size()) > options.keep) lora.resize(size_t(options.keep));
    for (FitCandidate& c : lora) found.push_back(std::move(c));
  }
  int rank_plans = 0;
  std::vector<FitCandidate> checked = plan_winners_on_every_rank(
      std::move(found), spec, cluster, eo, judge, options.global_batch, accumulation, rank_plans);
  rank_candidates(checked, options.tie_tolerance);
  r.ranked = std::move(checked);
  std::sort(r.rejected.begin(), r.rejected.end(),
            [](const RejectedFamily& a, const RejectedFamily& b) { return a.overflow.excess < b.overflow.excess; });
  r.programs_planned = planner.planned() + rank_plans;
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return r;
}

std::string format_fit(const FitResult& r, const Cluster& c, uint64_t budget) {
  std::string out = fmt::format("fit: {} families on {} x {} (budget {} per rank, {} usable: {:g}% headroom, "
                                "--headroom); {} programs planned, {} families pruned (could not beat the best), "
                                "{:.2f} s\n",
                                r.families, c.world_size(), c.hw.name, format_bytes(budget), format_bytes(r.usable),
                                100 * r.headroom, r.programs_planned, r.pruned, r.seconds);
  out += fmt::format("ranked by tokens/s; a near-tie (the faster gains under {:g}%) goes to the simpler configuration "
                     "(in this order, less of: tensor parallelism, parameter offload, optimizer offload, 8-bit state, "
                     "ZeRO stage, recomputation, mixed precision, flash attention)\n",
                     100 * r.tie_tolerance);
  const bool torch = r.framework != FitFramework::memfit, ds = r.framework == FitFramework::deepspeed;
  if (torch)
    out += fmt::format("fits by the predicted peak of the same step in {} plus the fixed runtime bytes; tokens/s are "
                       "memfit's estimate\n",
                       ds ? "DeepSpeed ZeRO (--framework deepspeed)"
                          : "HF transformers + PyTorch (--framework pytorch; on an H100 or H200 the caching "
                            "allocator's predicted reserve, max_memory_reserved)");
  if (!r.skipped.empty()) {
    int n = 0;
    std::string why;
    for (const auto& [reason, count] : r.skipped) n += count, why += fmt::format("{}{} {}", why.empty() ? "" : "; ", count, reason);
    out += fmt::format("skipped {} families the {} prediction does not model: {}\n", n, ds ? "DeepSpeed" : "PyTorch",
                       why);
  }
  if (r.ranked.empty()) out += "nothing fits\n";
  for (size_t i = 0; i < r.ranked.size(); ++i) {
    const FitCandidate& f = r.ranked[i];
    const uint64_t bytes = torch ? f.framework_bytes : f.estimate.device_bytes_of_largest_rank();
    out += fmt::format("{} {}, micro-batch {} x {}, accumulation {}: {:.0f} tokens/s, step {:.2f} s, {} per rank{} "
                       "({:.1f}% of {}; peak at '{}')\n",
                       i == 0 ? "winner:" : fmt::format("{:>6}.", i + 1), f.family, f.policy.batch, f.policy.seq,
                       f.policy.grad_accum, f.estimate.tokens_per_second, f.estimate.step_seconds, format_bytes(bytes),
                       torch ? (ds ? " in DeepSpeed" : " in PyTorch") : "", budget ? 100.0 * double(bytes) / double(budget) : 0.0,
                       format_bytes(budget), torch ? "memfit's plan: " + f.estimate.peak_op_name : f.estimate.peak_op_name);
    if (f.changes_training) out += lora_proposal_note(f.policy);
  }
  if (!r.rejected.empty()) {
    out += fmt::format("rejected families (do not fit at micro-batch 1; {} in all, closest first):\n", r.rejected.size());
    const size_t shown = std::min<size_t>(r.rejected.size(), 12);
    for (size_t i = 0; i < shown; ++i) {
      const RejectedFamily& f = r.rejected[i];
      out += fmt::format("  {}: {} tier over by {} (largest there: {})\n", f.family, tier_name(f.overflow.tier),
                         format_bytes(f.overflow.excess), category_name(f.overflow.category));
    }
    if (shown < r.rejected.size()) out += fmt::format("  ... {} more (--json lists all)\n", r.rejected.size() - shown);
  }
  return out;
}

nlohmann::json fit_json(const FitResult& r, const Cluster& c, uint64_t budget, const EstimateOptions& eo) {
  nlohmann::json ranked = nlohmann::json::array(), rejected = nlohmann::json::array();
  for (const FitCandidate& f : r.ranked)
    ranked.push_back({{"family", f.family},
                      {"tensor_parallel", f.tensor},
                      {"batch", f.policy.batch},
                      {"seq", f.policy.seq},
                      {"grad_accum", f.policy.grad_accum},
                      {"changes_what_trains", f.changes_training},
                      {"framework_bytes", f.framework_bytes},
                      {"estimate", estimate_json(f.estimate, c, eo)}});
  for (const RejectedFamily& f : r.rejected)
    rejected.push_back({{"family", f.family},
                        {"tier", tier_name(f.overflow.tier)},
                        {"category", category_name(f.overflow.category)},
                        {"excess_bytes", f.overflow.excess}});
  return {{"budget_bytes", budget},     {"headroom", r.headroom}, {"usable_bytes", r.usable},
          {"tie_tolerance", r.tie_tolerance},
          {"families", r.families}, {"programs_planned", r.programs_planned},
          {"pruned", r.pruned},         {"seconds", r.seconds},   {"ranked", ranked},
          {"rejected", rejected},
          {"framework", r.framework == FitFramework::pytorch     ? "pytorch"
                        : r.framework == FitFramework::deepspeed ? "deepspeed"
                                                                 : "memfit"},
          {"skipped", r.skipped}};
}

}  // namespace memfit
