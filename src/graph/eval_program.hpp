// Evaluation without training: the forward and the loss of a model on a batch, and nothing a
// step of training would need besides. The eval section is the one the training program ends
// with (graph/training_program.hpp), emitted by the same function, so evaluation in a training
// run and `memfit eval` compute the same loss the same way.
#pragma once

#include "graph/capabilities.hpp"
#include "graph/forward_rewrite.hpp"
#include "graph/model_forward.hpp"
#include "graph/model_spec.hpp"
#include "graph/policy.hpp"
#include "graph/program.hpp"

namespace memfit {

class GraphBuilder;

// Appends section "eval": load a batch (kEvalTokens, kEvalTargets), the forward through the
// rewrites, the classifier's loss only, its mean into the persistent kEvalLoss.
void emit_eval_section(GraphBuilder& b, const ModelSpec& spec, const ModelParams& params, const Policy& policy,
                       const ForwardRewrites& rewrites);

// The parameters of a program that only infers (eval, generate): the model's, with the
// forward rewrites' (LoRA adapters, a quantised base's storage), every one frozen, held in the
// policy's precision. The rewrites are for the sections the caller emits.
struct FrozenModel {
  ModelParams params;
  ForwardRewrites rewrites;
};
FrozenModel declare_frozen_model(GraphBuilder& b, const ModelSpec& spec, const Policy& policy);

// A program of one section, "eval", over every parameter frozen: no gradient, master weight or
// optimizer state exists, and parameters are held in the policy's precision (bf16 or fp16 under
// mixed precision, as training would hold them). Throws [policy] as build_training_program does
// for shapes the model cannot take.
Program build_eval_program(const ModelSpec& spec, const Policy& policy, const OpCapabilities& backend);

}  // namespace memfit
