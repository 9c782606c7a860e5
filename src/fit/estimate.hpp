// What a run needs per rank on given hardware, and how long its step takes, for any policy
// the engine knows, including those this machine cannot execute. The step program is built
// and planned by the same builder and planner that execute memfit's runs. ZeRO on W ranks is
// rank 0's own program (Topology{data = W, rank = 0}, the real stage: graph/zero.hpp), planned
// as it would run (plan_every_rank plans the others too: their pieces differ, so their peaks
// may differ by a few KiB). Only where the builder cannot express the policy (offload,
// until issue 16; frozen parameters or the update in backward with ZeRO) is the unsharded
// program planned and sharding and offload applied to its per-op live bytes
// (fit/model_states.hpp, a labelled estimate, with no packing: no such program was packed).
// The rank's fixed runtime overheads are added.
//
// Invariant (tested): without offload the device peak is the rank program's planned peak plus
// the hardware's fixed overheads, and on the "cpu" hardware (backend scratch attached, none
// fixed) it is the peak the executed run measures on rank 0, for any stage and world.
//
// Step time, stated plainly: every op is timed by a roofline, max(flops / (peak of its dtype
// x efficiency), bytes it reads and writes / (memory bandwidth x 0.8)), its dtype that of its
// largest float input (a bf16 product writing fp32 gradients is a bf16 GEMM); recomputed ops are
// counted apart; collectives are ring volumes over the slowest link they cross (not
// overlapped with compute unless --comm-overlap); offload traffic crosses the host link (or
// the disk), and an offloaded optimizer runs at host memory bandwidth.
#pragma once

#include <algorithm>
#include <array>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "fit/hardware.hpp"
#include "fit/model_states.hpp"
#include "graph/model_spec.hpp"
#include "plan/memory_plan.hpp"

namespace memfit {

struct EstimateOptions {
  double efficiency = 0.45;   // share of peak FLOP/s compute-bound ops reach
  double comm_overlap = 0.0;  // share of collective time hidden behind compute
  // Called on the built program before planning (the CPU backend's scratch on "cpu").
  std::function<void(Program&)> prepare;
  // Offsets per tier are multiples of these (the backend's buffer types on "cpu").
  TierAlignments alignments = kDefaultTierAlignments;
};

// What LoRA and a quantised base put in the planned program (fit/lora_breakdown.hpp); `on` false
// otherwise. Bytes are unsharded, one copy of the model.
struct LoraBreakdown {
  bool on = false;
  int adapters = 0;
  int64_t rank = 0;
  int64_t adapter_elements = 0;                            // sum of r (in + out) over targets
  std::array<uint64_t, kNumCategories> adapter_bytes{};    // the adapters' value, gradient, master, state
  uint64_t frozen_bytes = 0;                               // frozen base kept in its dtype
  uint64_t quantized_bytes = 0;                            // codes and scales of quantised base weights
  int quantized_tensors = 0;
  int64_t quantized_elements = 0;
  std::string quant;                                       // "nf4, block 64, double quantisation"; "" none
  uint64_t branch_bytes = 0;                               // x A^T (and dropout(x)) of every adapter
  uint64_t tile_bytes = 0, input_grad_bytes = 0;           // dequantisation tile; fp32 input gradient
  int64_t dora_magnitudes = 0;                             // DoRA: trained magnitude elements
  uint64_t dora_saved_bytes = 0;                           // DoRA: z of every adapted product
  double dora_norm_flops = 0;                              // DoRA: ||W + s B A|| per forward
};

// A planned program reduced to what estimates need (cheap to keep for many candidates).
struct ProgramSummary {
  std::vector<CategoryBytes> live;  // device tier, per op
  std::vector<Phase> phase;
  std::vector<std::string> op_name;
  uint64_t packing_overhead = 0;    // planned peak - largest live total (fragmentation)
  uint64_t plan_peak = 0;
  StateElements states;
  // Unsharded model-state elements (also for a rank's sharded program: what ZeRO divides).
  int64_t parameters = 0;
  int64_t largest_layer_parameters = 0;   // elements of the largest block's (or embedding's) parameters
  int64_t largest_tensor_parameters = 0;  // elements of the largest parameter tensor (DeepSpeed's "largest layer")
  DType param_dtype = DType::f32, grad_dtype = DType::f32;
  double micro_flops = 0, recompute_flops = 0, optimizer_flops = 0;  // one execution each
  double micro_seconds = 0, recompute_seconds = 0, optimizer_seconds = 0, optimizer_bytes = 0;
  int ops = 0;
  // Rank programs (zero_from_program): the stage and data-parallel degree the program was
  // built for, and the bytes its collectives send per rank (ring volumes, Op::comm_bytes).
  bool zero_from_program = false;
  int zero_stage = 0, world = 1;
  int tensor = 1;  // ranks per model replica (tensor parallelism): world / tensor replicas read tokens
  double micro_comm_bytes = 0, step_comm_bytes = 0;  // per micro-step; once per step (sync, optimizer)
  double micro_tensor_comm_bytes = 0;  // of micro_comm_bytes: the tensor group's (inside a node)
  std::array<uint64_t, kNumTiers> tier_peak{};       // planned arena bytes per tier
  std::array<CategoryBytes, kNumTiers> tier_at_peak{};
  CategoryBytes category_peak{};                     // device: most live bytes of each category at any op
  LoraBreakdown lora;                                // LoRA / quantised base: their parts of the program
};

// The roofline every op is timed by: max(flops / (peak of dt x efficiency), bytes / (memory
// bandwidth x 0.8)); op_seconds reads an op's FLOPs, bytes and dtype (its largest float
// input's; a quantised product's compute dtype) from its program.
double roofline_seconds(double flops, double bytes, DType dt, const Hardware& hw, double efficiency);
double op_seconds(const Program& p, const Op& op, const Hardware& hw, double efficiency);

// The unsharded program a policy plans with: zero stage and offload set aside (the eval
// section stays as the policy says: the run holds its memory; its ops are not timed).
Policy planning_policy(const Policy& policy);
// Whether the estimate plans the rank program itself on `world` ranks: no offload (the builder
// expresses it, but for this CPU backend; on GPU presets offload is placed as DeepSpeed places
// it, the labelled model, and `memfit plan` without --hardware plans the real offload program),
// and with ZeRO or more than one rank neither frozen parameters nor the update in backward
// (refused). Else sharding is the labelled estimate.
bool zero_from_program(const Policy& policy, int world);
ProgramSummary summarize_program(const Program& program, const MemoryPlan& plan, const Hardware& hw,
                                 const EstimateOptions& options);
// The unsharded program's summary (planning_policy).
ProgramSummary plan_summary(const ModelSpec& spec, const Policy& policy, const Hardware& hw,
                            const EstimateOptions& options);
// Rank 0's program of `world` ranks, `tensor` of them per model replica (tensor parallelism;
// the rest data-parallel at the policy's stage; zero_from_program must hold); `unsharded` is
// plan_summary's, whose model-state elements it keeps.
ProgramSummary plan_rank_summary(const ModelSpec& spec, const Policy& policy, int world, const Hardware& hw,
                                 const EstimateOptions& options, const ProgramSummary& unsharded, int tensor = 1);
// What an estimate of the policy on `world` ranks starts from: the rank program where
// zero_from_program holds (always under tensor parallelism), else the unsharded program.
ProgramSummary plan_run_summary(const ModelSpec& spec, const Policy& policy, int world, const Hardware& hw,
                                const EstimateOptions& options, int tensor = 1);

struct RankEstimate {
  // Memory per rank.
  std::array<CategoryBytes, kNumTiers> by_tier{};  // device: at the device peak op
  uint64_t fixed_overhead = 0;                     // framework + GEMM workspace + collective buffers
  uint64_t device_bytes = 0;                       // peak incl. packing and fixed overheads
  uint64_t host_bytes = 0, disk_bytes = 0;         // per rank
  uint64_t packing_overhead = 0;  // this rank program's own; 0 for the labelled (analytic) estimate
  int peak_op = -1;
  std::string peak_op_name;
  Phase peak_phase = Phase::forward;
  // True when the figures are rank 0's planned program (no analytic sharding or offload).
  bool from_program = true;
  // The other ranks (plan_every_rank): their pieces of the buckets differ, and with them the
  // number of piece tensors and 8-bit scale blocks, so a rank may plan a few KiB more than 0.
  int ranks_planned = 1;
  int largest_rank = 0;
  uint64_t largest_rank_device_bytes = 0;  // incl. fixed overheads; 0: only rank 0 planned
  uint64_t device_bytes_of_largest_rank() const { return std::max(device_bytes, largest_rank_device_bytes); }
  // Model states per rank. From a rank program: device holds the most live bytes of each
  // category at any op (shards plus gathered buckets and transient gradients); full is unsharded.
  ShardedStates states;
  // Time per optimizer step.
  double compute_seconds = 0, recompute_seconds = 0, comm_seconds = 0, offload_seconds = 0, step_seconds = 0;
  double comm_bytes = 0, offload_bytes = 0;
  double tokens_per_second = 0;  // all ranks
  double model_flops_utilization = 0;
  LoraBreakdown lora;  // what LoRA and a quantised base put in the program (fit/lora_breakdown.hpp)
};

RankEstimate estimate_from_summary(const ProgramSummary& summary, const Policy& policy, const Cluster& cluster,
                                   const EstimateOptions& options);
RankEstimate estimate_run(const ModelSpec& spec, const Policy& policy, const Cluster& cluster,
                          const EstimateOptions& options, int tensor = 1);
// Plans ranks 1..W-1 of a rank-program estimate too (one build and plan each) and records the
// largest; does nothing for the labelled model, one rank, or more than `max_world` ranks.
inline constexpr int kMaxRanksPlanned = 64;
void plan_every_rank(const ModelSpec& spec, const Policy& policy, const Cluster& cluster, const EstimateOptions& options,
                     RankEstimate& e, int max_world = kMaxRanksPlanned, int tensor = 1);

// Where the estimate does not fit (on its largest planned rank): the tier and the category
// holding the most bytes there, and the excess over the capacity. Empty when it fits.
struct Overflow {
  Tier tier = Tier::device;
  Category category = Category::activations;
  uint64_t excess = 0;
  bool fits() const { return excess == 0; }
};
Overflow check_fit(const RankEstimate& e, const Cluster& cluster, uint64_t device_budget);

std::string format_estimate(const RankEstimate& e, const Cluster& cluster, const EstimateOptions& options);
nlohmann::json estimate_json(const RankEstimate& e, const Cluster& cluster, const EstimateOptions& options);

}  // namespace memfit
