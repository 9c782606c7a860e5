// Forward rewrites: the stage of build_training_program between emitting a model's forward
// pass and differentiating it. An ordered list of passes may add parameters, change how a
// parameter is stored (graph/program.hpp: storage records), freeze parameters, and replace
// ops of the forward (a linear by a dequantise-then-multiply plus a low-rank branch, or by a
// column-parallel split). Autodiff, precision, recomputation, ZeRO, the optimizer and the
// planner then see only the rewritten forward.
// Invariants: with no pass the program is untouched, op for op; a replacement writes the
// replaced op's own outputs, so every later reader is unchanged; parameters are added and
// frozen only in the declare stage, before masters, optimizer state and gradients exist.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "graph/builder.hpp"
#include "graph/policy.hpp"

namespace memfit {

class ForwardRewrite {
 public:
  virtual ~ForwardRewrite() = default;
  virtual std::string name() const = 0;
  // Once per program, after the model declared its parameters and before anything is
  // derived from them: add parameters (GraphBuilder::parameter), freeze some
  // (freeze_parameter), change a parameter's storage. Resets any state of an earlier build.
  virtual void declare(GraphBuilder& b) { (void)b; }
  // Once per forward op, in order, for every forward pass (the micro-step's and validation's,
  // which read the same parameters): emit a replacement through `b` that writes `op`'s
  // outputs and return true, or return false to keep `op` as it is.
  virtual bool rewrite(const Op& op, GraphBuilder& b) {
    (void)op, (void)b;
    return false;
  }
};
using ForwardRewrites = std::vector<std::shared_ptr<ForwardRewrite>>;

// The rewrites that the training options ask for, in order (today: freezing by --freeze).
// data_rank: this rank's index among the data-parallel ranks (LoRA's dropout masks).
ForwardRewrites forward_rewrites_for(const Policy& policy, int data_rank = 0);

// Runs every pass's declare stage, in order. Throws [policy] when no trainable parameter is
// left.
void declare_forward_rewrites(GraphBuilder& b, const ForwardRewrites& passes);
// Replaces the ops [begin, end of program) (one forward pass, just emitted) by what the
// passes make of them, pass after pass. When anything was replaced, the forward's
// requires-gradient flags are derived again (an output needs a gradient when an input does),
// so that autodiff differentiates exactly the paths that reach a trainable parameter.
void rewrite_forward(GraphBuilder& b, int begin, const ForwardRewrites& passes);

// Marks a parameter frozen: no gradient, master or optimizer state; its tensors need no
// gradient. Only in the declare stage.
void freeze_parameter(Program& p, ParamEntry& e);

// Glob match (fnmatch, '*' crosses dots): "h.*.attn.*" matches "h.0.attn.c_attn.weight", as
// do "transformer.h.*.attn.*" and, for llama names, "model.layers.*" (HF's full names).
bool parameter_name_matches(const std::string& pattern, const std::string& name);

// What freezing saves: the frozen parameters' gradients, masters and optimizer state, in the
// closed form of the policy (bytes per element of each), against the same run unfrozen.
struct FrozenSummary {
  int64_t params = 0, elements = 0;
  int64_t gradient_bytes = 0, master_bytes = 0, optimizer_bytes = 0;
  int64_t total_bytes() const { return gradient_bytes + master_bytes + optimizer_bytes; }
};
FrozenSummary summarize_frozen(const Program& p, const Policy& policy);

}  // namespace memfit
