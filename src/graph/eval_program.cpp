#include "graph/eval_program.hpp"

#include "core/error.hpp"
#include "graph/builder.hpp"
#include "graph/precision.hpp"
#include "graph/schedule_async.hpp"
#include "graph/training_program.hpp"

namespace memfit {

void emit_eval_section(GraphBuilder& b, const ModelSpec& spec, const ModelParams& params, const Policy& policy,
                       const ForwardRewrites& rewrites) {
  Program& p = b.program();
  const int64_t B = policy.batch, T = policy.seq, N = B * T;
  p.begin_section(SectionKind::eval);
  b.set_grad_enabled(false);
  b.set_phase(Phase::forward);
  b.set_layer(-1);
  const TensorId eval_loss = b.persistent(kEvalLoss, Shape{1}, Category::activations);
  const TensorId tokens = b.transient(kEvalTokens, Shape{B, T}, Category::activations, DType::i32);
  const TensorId targets = b.transient(kEvalTargets, Shape{B, T}, Category::activations, DType::i32);
  b.emit({OpKind::load_input, "load_eval_batch", {}, {tokens, targets}});
  const int eval_begin = int(p.ops().size());
  const TensorId hidden = model_forward(b, spec, params, tokens, "eval.", policy.attention);
  rewrite_forward(b, eval_begin, rewrites);
  ClassifierAttrs c;
  c.rows = N;
  c.vocab = spec.vocab_size;
  c.chunk_rows = classifier_chunk_rows(spec, policy);
  TensorId losses = kNoTensor;
  if (b.tensor_parallel().on()) {
    c.vocab_begin = int64_t(b.tensor_parallel().index) * p.tensor(params.classifier_weight).shape[0];
    c.parts = b.tensor_parallel().parts;
    losses = b.vocab_parallel_losses("eval.classifier.", hidden, params.classifier_weight, targets, c).losses;
  } else {
    losses = b.transient("eval.losses", Shape{N}, Category::activations);
    const TensorId chunk = b.transient("eval.logits_chunk", Shape{c.chunk_rows, spec.padded_vocab}, Category::temporaries);
    b.emit({OpKind::classifier_eval, "eval.classifier", {hidden, params.classifier_weight, targets}, {losses}, c,
            2.0 * double(N) * double(spec.padded_vocab) * double(spec.n_embd), {}, {chunk}});
  }
  b.emit({OpKind::loss_mean, "eval.loss", {losses}, {eval_loss}, ScaleAttrs{1.0f / float(N)}, double(N)});
  b.set_grad_enabled(true);
  p.end_section();
}

FrozenModel declare_frozen_model(GraphBuilder& b, const ModelSpec& spec, const Policy& policy) {
  FrozenModel m{declare_model_parameters(b, spec), forward_rewrites_for(policy)};
  // LoRA adapters and a quantised base change the forward: a model infers as it trains (with
  // its adapter, on its quantised weights).
  if (!m.rewrites.empty()) declare_forward_rewrites(b, m.rewrites);
  Program& p = b.program();
  for (ParamEntry& e : p.params()) freeze_parameter(p, e);
  declare_master_weights(b, policy);  // 16-bit parameters under mixed precision; frozen ones get no master
  return m;
}

Program build_eval_program(const ModelSpec& spec, const Policy& policy, const OpCapabilities& backend) {
  spec.validate();
  MEMFIT_CHECK(policy.batch >= 1 && policy.seq >= 1, "policy", "batch {} x sequence {}: both must be at least 1",
               policy.batch, policy.seq);
  MEMFIT_CHECK(policy.seq <= spec.max_seq, "policy", "sequence length {} exceeds the context of model '{}' ({} positions)",
               policy.seq, spec.name, spec.max_seq);
  Program p;
  GraphBuilder b(p);
  const FrozenModel m = declare_frozen_model(b, spec, policy);
  emit_eval_section(b, spec, m.params, policy, m.rewrites);
  apply_precision(p, policy, backend);
  schedule_async(p, AsyncOptions{.overlap_comm = policy.overlap_comm});
  p.validate();
  return p;
}

}  // namespace memfit
