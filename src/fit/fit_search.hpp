// `memfit plan --fit`: the fastest configuration that fits a memory budget on given hardware.
//
// A family is one choice of precision, attention, recomputation, optimizer, ZeRO stage and
// offload; within a family the micro-batch is the largest that fits (memory grows with it)
// and the accumulation follows from the global batch (or the run's --grad-accum). A family fits
// when its per-rank peak leaves FitOptions::headroom of the budget free. Families are ranked by
// estimated tokens/s (fit/estimate.hpp), a near-tie going to the simpler one (rank_candidates).
//
// Candidates are planned by the builder and planner that run them: a family without offload
// on W ranks is rank 0's program at its ZeRO stage (fit/estimate.hpp); offload families shard
// the unsharded program's categories (the labelled model). Plans are memoised per (precision,
// attention, recomputation, optimizer, micro-batch, accumulation on, ZeRO stage, world). The
// micro-batch is guessed from the micro-batch 1 and 2 plans (activations grow about linearly)
// and then checked by planning the guess and its neighbour. When nothing fits without offload,
// LoRA on every linear (and on an NF4 base) is searched too, listed last, labelled as changing
// what trains. Two prunings: a family that does
// not fit at micro-batch 1 is rejected; and a program key whose batch-1 compute time per token
// already exceeds the k-th best step time per token is not searched further (communication
// and offload only add time).
#pragma once

#include <array>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "fit/estimate.hpp"
#include "fit/framework_deepspeed.hpp"
#include "fit/framework_pytorch.hpp"

namespace memfit {

// What decides whether a candidate fits: memfit's own plan of it, or the peak the same step has
// in HF transformers + PyTorch (fit/framework_pytorch.hpp), the fixed runtime bytes added. A
// user who takes the winner to PyTorch needs the second: its peak is elsewhere and higher.
// deepspeed: the same step's per-rank peak under DeepSpeed ZeRO (fit/framework_deepspeed.hpp).
enum class FitFramework : uint8_t { memfit, pytorch, deepspeed };

struct FitOptions {
  uint64_t budget = 0;         // device bytes per rank; 0: the hardware's memory
  int64_t max_batch = 64;      // largest micro-batch tried
  int64_t global_batch = 0;    // sequences per optimizer step over all ranks; 0: keep grad_accum
  int keep = 5;                // winners reported
  // Share of the budget every candidate leaves free: a real run's allocator rounds and caches,
  // and libraries allocate what no plan sees. Winners at 98% of a GPU (issue 19) fail there.
  double headroom = 0.05;
  // A configuration that uses more techniques (fit_complexity) ranks above a simpler one only
  // when it is at least this much faster in tokens/s.
  double tie_tolerance = 0.05;
  FitFramework framework = FitFramework::memfit;
  // pytorch: only candidates whose attention is this HF attn_implementation (flash is sdpa,
  // plain is eager); empty: either.
  std::optional<TorchAttention> torch_attention;
  // deepspeed: zero_optimization's sizes and overlap_comm (the stage is each candidate's) and
  // whether the optimizer is torch's AdamW; DeepSpeed's defaults unless a config gave them.
  DeepSpeedZero deepspeed_zero;
  bool deepspeed_torch_adam = false;
  // memfit's own runs: also tensor parallelism within a node (degrees 2, 4, 8 that divide the
  // node, the world and the model), with ZeRO over the replicas.
  bool search_tensor_parallel = true;
};

// The DeepSpeed step a candidate is under FitOptions' DeepSpeed settings; empty with `why`.
std::optional<DeepSpeedStep> fit_deepspeed_step(const Policy& p, int world, const FitOptions& o, std::string& why);

// Device bytes per rank a candidate may plan, fixed runtime bytes included: (1 - headroom) x
// budget, rounded down.
uint64_t usable_bytes(uint64_t budget, double headroom);

// What a configuration asks of the run, compared lexicographically (smaller is simpler). The
// techniques, from the one most worth avoiding to the least: parameter offload (host, then
// disk), optimizer offload (host, then disk), 8-bit optimizer state (changes the update's
// numerics), ZeRO stage, recomputation (selective, then full), mixed precision, flash
// attention. A configuration is simpler when it uses less of the first technique where two
// differ.
using FitComplexity = std::array<int, 7>;
FitComplexity fit_complexity(const Policy& p);

// Rank of the LoRA adapters --fit proposes when nothing that trains every weight fits.
inline constexpr int64_t kProposedLoraRank = 16;

struct FitCandidate {
  Policy policy;
  RankEstimate estimate;
  std::string family;  // "bf16 flash recompute=none adamw zero=1 offload=none"
  // LoRA (and a quantised base) that the run did not ask for: it trains something else. Only
  // searched when nothing else fits without offload; such candidates come last.
  bool changes_training = false;
  // FitFramework::pytorch: the predicted PyTorch peak plus the fixed runtime bytes, what fits was
  // decided on; 0 under memfit.
  uint64_t framework_bytes = 0;
  int tensor = 1;  // tensor-parallel degree (ranks per model replica; the rest data-parallel)
};

struct RejectedFamily {
  std::string family;
  Overflow overflow;  // at micro-batch 1
};

struct FitResult {
  // First the simplest of those within the tie tolerance of the fastest, then the same among
  // the rest (rank_candidates); at most FitOptions::keep.
  std::vector<FitCandidate> ranked;
  std::vector<RejectedFamily> rejected; // families that do not fit even at micro-batch 1
  int families = 0;
  int programs_planned = 0;
  int pruned = 0;  // families not searched because they could not beat the best
  double seconds = 0;
  uint64_t budget = 0;   // device bytes per rank
  double headroom = 0;   // FitOptions::headroom
  double tie_tolerance = 0;
  uint64_t usable = 0;   // usable_bytes(budget, headroom): what every candidate fits in
  FitFramework framework = FitFramework::memfit;
  // Families the framework's prediction does not cover, by why (not errors: the search goes on).
  std::map<std::string, int> skipped;
};

// Orders candidates: those that train what was asked before those that change it (LoRA); within
// each, repeatedly the simplest (fit_complexity, then faster) of those the fastest remaining does
// not beat by `tolerance` or more, so a near-tie goes to the simpler configuration.
void rank_candidates(std::vector<FitCandidate>& candidates, double tolerance);

std::string family_name(const Policy& p);
// " tensor=T" (with "+sequence" under sequence parallelism) for a tensor-parallel degree above 1.
std::string tensor_parallel_label(int tensor, const Policy& p);

// `base` carries what the search does not choose: sequence length, accumulation, clipping,
// AdamW hyper-parameters.
FitResult fit_search(const ModelSpec& spec, const Policy& base, const Cluster& cluster,
                     const EstimateOptions& estimate_options, const FitOptions& options);

std::string format_fit(const FitResult& r, const Cluster& cluster, uint64_t budget);
nlohmann::json fit_json(const FitResult& r, const Cluster& cluster, uint64_t budget,
                        const EstimateOptions& estimate_options);

}  // namespace memfit
