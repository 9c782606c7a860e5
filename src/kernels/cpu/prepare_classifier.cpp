// CPU prepare functions of the loss: the fused classifier (logits, softmax, cross-entropy and
// their gradients, chunked over rows, oneDNN products), the vocabulary-parallel classifier's
// three ops (classifier_parallel.hpp) and loss_mean.
#include <algorithm>

#include "kernels/cpu/classifier.hpp"
#include "kernels/cpu/classifier_parallel.hpp"
#include "kernels/cpu/cpu_prepare.hpp"
#include "kernels/cpu/reduce.hpp"

namespace memfit::cpu {
namespace {

// The fused classifier's outputs are [losses, dx, dwte]; classifier_parallel_backward's [dx, dw];
// classifier_partial's [stats] (no losses, no gradient).
bool parallel_backward(const Op& op) { return op.kind == OpKind::classifier_parallel_backward; }
size_t dx_slot(const Op& op) { return parallel_backward(op) ? 0 : 1; }

ClassifierShape classifier_shape(const Program& program, const Op& op) {
  const ClassifierAttrs& a = attrs_of<ClassifierAttrs>(op);
  const TensorDesc& wte = program.tensor(op.inputs[1]);
  const bool grads = op.kind == OpKind::classifier || parallel_backward(op);
  ClassifierShape s;
  s.rows = a.rows;
  s.channels = wte.shape.last();
  s.vocab = a.vocab;
  s.padded_vocab = wte.shape.rows();
  s.chunk_rows = a.chunk_rows;
  s.vocab_begin = op.kind == OpKind::classifier || op.kind == OpKind::classifier_eval ? 0 : a.vocab_begin;
  s.dtype = wte.dtype;
  s.grad_dtype = grads ? dtype_of(program, op.outputs[dx_slot(op) + 1]) : DType::f32;
  return s;
}

ClassifierOutputs classifier_outputs(const Op& op) {
  ClassifierOutputs o;
  o.pass = op.kind == OpKind::classifier_partial ? ClassifierPass::partial_stats
           : parallel_backward(op)              ? ClassifierPass::backward_from_lse
                                                : ClassifierPass::fused;
  o.losses = o.pass == ClassifierPass::fused && op.outputs[0] != kNoTensor;
  if (op.kind == OpKind::classifier || parallel_backward(op)) {
    const size_t j = dx_slot(op);
    o.dx = op.outputs[j] != kNoTensor;
    o.dwte = op.outputs[j + 1] != kNoTensor;
    o.dx_modes = WriteVariants::of(op.modes[j]);
    o.dwte_modes = WriteVariants::of(op.modes[j + 1]);
  }
  return o;
}

}  // namespace

uint64_t classifier_scratch_bytes(const DnnlEnv& env, const Program& p, const Op& op) {
  return ClassifierKernel::scratch_bytes(env, classifier_shape(p, op), classifier_outputs(op));
}

Prepared prepare_classifier(const DnnlEnv& env, const Program& p, const Op& op, const OpBinding& b) {
  if (op.kind == OpKind::classifier_combine) {
    const ClassifierAttrs& a = attrs_of<ClassifierAttrs>(op);
    return make_op([=, stats = in_f(b, 0), losses = out_f(b, 0), lse = out_f(b, 1)](const StepContext&) {
      classifier_combine(stats, losses, lse, a.parts, a.rows);
    });
  }
  const bool grads = op.kind == OpKind::classifier || parallel_backward(op);
  const bool partial = op.kind == OpKind::classifier_partial;
  const bool fused = op.kind == OpKind::classifier || op.kind == OpKind::classifier_eval;
  const size_t j = dx_slot(op);
  const float grad_scale = attrs_of<ClassifierAttrs>(op).grad_scale;
  ClassifierKernel kernel(env, classifier_shape(p, op), classifier_outputs(op));
  kernel.bind(b.inputs[0], b.inputs[1], in_i(b, 2), fused ? out_f(b, 0) : nullptr,
              grads ? b.outputs[j] : nullptr, grads ? b.outputs[j + 1] : nullptr, static_cast<float*>(b.workspace[0]),
              scratch_of(p, op, b), partial ? out_f(b, 0) : nullptr, parallel_backward(op) ? in_f(b, 3) : nullptr);
  const WriteMode m1 = grads ? op.modes[j] : WriteMode::overwrite, m2 = grads ? op.modes[j + 1] : WriteMode::overwrite;
  return make_op([kernel = std::move(kernel), grad_scale, m1, m2](const StepContext& ctx) {
    kernel.run(grad_scale * ctx.loss_scale, accumulates(m1, ctx), accumulates(m2, ctx));
  });
}

Prepared prepare_loss_mean(const Program& p, const Op& op, const OpBinding& b) {
  const int64_t n = p.tensor(op.inputs[0]).numel();
  const float scale = attrs_of<ScaleAttrs>(op).scale;
  return make_op([=, l = in_f(b, 0), y = out_f(b, 0), mode = op.modes[0]](const StepContext& ctx) {
    loss_mean(l, y, n, scale, accumulates(mode, ctx));
  });
}

}  // namespace memfit::cpu
