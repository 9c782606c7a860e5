// Builds the whole step program of a training run from a model, a policy and a topology:
//   section "micro" (repeated grad_accum times): load batch, forward, fused classifier
//     (loss + its gradient), backward;
//   section "optimizer": the update of every parameter (graph/optimizer.hpp: fused AdamW or
//     8-bit AdamW, after the global gradient norm when clipping);
//   section "eval" (optional): load a validation batch, forward, loss only.
// Later techniques (precision, recomputation, sharding, offload) are transformations applied
// to what this emits.
#pragma once

#include "graph/model_spec.hpp"
#include "graph/policy.hpp"
#include "graph/program.hpp"

namespace memfit {

// Throws [policy] for a policy this build cannot express (naming the field), and for shapes
// the model cannot take (a sequence longer than its context, a zero batch). A tensor-parallel
// degree above 1 is refused: no builder splits a layer over tensor ranks yet.
Program build_training_program(const ModelSpec& spec, const Policy& policy, const Topology& topology);
// The program a rank of `topology` would run if every tensor rank held the whole model: what
// the data-parallel passes (ZeRO over the data group) make of a tensor-parallel topology, for
// tests until layers are split. Nothing runs it.
Program build_unsplit_training_program(const ModelSpec& spec, const Policy& policy, const Topology& topology);

// Rows of logits the classifier materialises at once under `policy` (never all B*T rows of a
// large vocabulary).
int64_t classifier_chunk_rows(const ModelSpec& spec, const Policy& policy);

// Names of well-known tensors of a built program.
inline constexpr const char* kTokens = "tokens";
inline constexpr const char* kTargets = "targets";
inline constexpr const char* kLoss = "loss";
inline constexpr const char* kEvalTokens = "eval.tokens";
inline constexpr const char* kEvalTargets = "eval.targets";
inline constexpr const char* kEvalLoss = "eval.loss";

}  // namespace memfit
