// Builds the whole step program of a training run from a model, a policy and a topology:
//   section "micro" (repeated grad_accum times): load batch, forward, fused classifier
//     (loss + its gradient), backward;
//   section "optimizer": the update of every parameter (graph/optimizer.hpp: fused AdamW or
//     8-bit AdamW, after the global gradient norm when clipping);
//   section "eval" (optional): load a validation batch, forward, loss only.
// Between the forward and autodiff runs the forward-rewrite stage (graph/forward_rewrite.hpp).
// Later techniques (precision, recomputation, sharding, offload) are transformations applied
// to what this emits.
#pragma once

#include "graph/forward_rewrite.hpp"
#include "graph/capabilities.hpp"
#include "graph/model_spec.hpp"
#include "graph/policy.hpp"
#include "graph/program.hpp"

namespace memfit {

// Throws [policy] for a policy this build cannot express (naming the field), and for shapes
// the model cannot take (a sequence longer than its context, a zero batch). Under a tensor
// degree above 1 the builders split each layer (graph/tensor_parallel.hpp). `backend` is what
// the backend that will run the program computes natively (Backend::capabilities(), or a planned
// device's table): the precision pass makes fp32 islands of the rest.
// The forward passes go through the forward rewrites the policy asks for (--freeze), then
// `extra_rewrites` (passes that no option names yet, e.g. a test's), before autodiff.
Program build_training_program(const ModelSpec& spec, const Policy& policy, const Topology& topology,
                               const OpCapabilities& backend, const ForwardRewrites& extra_rewrites = {});
// The program a rank of `topology` would run if every tensor rank held the whole model: what
// the data-parallel passes (ZeRO over the data group) make of a tensor-parallel topology, for
// tests of those passes alone. Nothing runs it.
Program build_unsplit_training_program(const ModelSpec& spec, const Policy& policy, const Topology& topology,
                                       const OpCapabilities& backend, const ForwardRewrites& extra_rewrites = {});

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
