// `--recompute auto`: the cheapest recomputation that makes a run fit a memory budget, found
// by building and planning candidate programs with the real builder and planner (no formula).
//
// Each block gets one of a few levels, ordered by how many bytes they save per recomputed
// FLOP: none; the layernorm outputs; + the GELU output; + the attention probabilities (plain
// attention only: flash keeps none); the whole block. A choice costs the recompute FLOPs of
// its program (additive over blocks). Candidates are the assignments with levels falling from
// block 0 to the last block — a block's activations live from its forward until its backward,
// and the backward visits block 0 last, so block 0's are held longest and are the first worth
// recomputing. They are planned in order of increasing cost and the first that fits wins; a
// candidate that keeps at least as much as one already seen not to fit is skipped unplanned.
//
// Subtle point: the answer is exact over those candidates as long as keeping more never
// lowers the peak; tests/plan/recompute_search_test.cpp compares it with an exhaustive search
// over every assignment (any order of levels) on small models.
//
// The classifier's logits chunk is the other memory the search trades for FLOPs when the
// policy leaves it automatic: a large vocabulary's chunk (up to 128 MiB of fp32 logits) is
// often the peak's largest temporary, and halving it can spare whole blocks' recomputation
// (QLoRA on a TinyLlama shape: 139 GFLOP per micro-step at 1024 rows, 1.2 at 512). Smaller
// chunks run the classifier's products less efficiently, so a smaller chunk is taken only when
// it saves more recomputed FLOPs than a tenth of the classifier's own, and never below 256 rows.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "graph/capabilities.hpp"
#include "graph/model_spec.hpp"
#include "graph/policy.hpp"
#include "graph/program.hpp"

namespace memfit {

// Called on every candidate program before it is planned (memfit passes the backend's
// library-scratch attachment, so a candidate's peak is the peak the run would have).
using ProgramPrepare = std::function<void(Program&)>;

struct RecomputeChoice {
  std::vector<BlockRecompute> blocks;  // one per block
  bool fits = false;                   // false: even the most recomputation exceeds the budget
  uint64_t peak_bytes = 0;             // device peak of the chosen program
  double recompute_flops = 0;          // per micro-step
  int planned = 0;                     // candidate programs built and planned
  int64_t classifier_chunk_rows = 0;   // > 0: the logits chunk the choice needs (the policy's was automatic)
};

// The smaller logits chunks the search may take for a policy whose chunk is automatic (the
// automatic one halved while at least 256 rows remain, multiples of 16); empty otherwise.
std::vector<int64_t> smaller_classifier_chunks(const ModelSpec& spec, const Policy& policy);

// The per-block levels the search chooses from, cheapest first.
std::vector<BlockRecompute> recompute_levels(AttentionKind attention);

// `policy.recompute` is ignored; everything else of the policy is the run's (an automatic
// classifier chunk may come back smaller: classifier_chunk_rows).
// `backend`: the capabilities candidates are built for (build_training_program).
RecomputeChoice choose_recompute(const ModelSpec& spec, const Policy& policy, const Topology& topology,
                                 const OpCapabilities& backend, uint64_t budget, const ProgramPrepare& prepare = {});

// The reference the search is tested against: every assignment of every level to every block
// (levels^layers programs, each built and planned), and the best of them for a budget (the
// least recompute FLOPs among those that fit, then the lowest peak; fits = false when none does).
struct RecomputeCandidate {
  std::vector<BlockRecompute> blocks;
  uint64_t peak_bytes = 0;
  double recompute_flops = 0;
};
std::vector<RecomputeCandidate> plan_every_assignment(const ModelSpec& spec, const Policy& policy,
                                                      const Topology& topology, const OpCapabilities& backend,
                                                      const ProgramPrepare& prepare = {});
RecomputeChoice choose_recompute_exhaustive(const std::vector<RecomputeCandidate>& all, uint64_t budget);

}  // namespace memfit
