// CPU prepare functions of the loss: the fused classifier (logits, softmax, cross-entropy and
// their gradients, chunked over rows, oneDNN products) and loss_mean.
#include <algorithm>

#include "kernels/cpu/classifier.hpp"
#include "kernels/cpu/cpu_prepare.hpp"
#include "kernels/cpu/reduce.hpp"

namespace memfit::cpu {
namespace {

ClassifierShape classifier_shape(const Program& program, const Op& op) {
  const ClassifierAttrs& a = attrs_of<ClassifierAttrs>(op);
  const TensorDesc& wte = program.tensor(op.inputs[1]);
  ClassifierShape s;
  s.rows = a.rows;
  s.channels = wte.shape.last();
  s.vocab = a.vocab;
  s.padded_vocab = wte.shape.rows();
  s.chunk_rows = a.chunk_rows;
  s.dtype = wte.dtype;
  s.grad_dtype = op.kind == OpKind::classifier ? dtype_of(program, op.outputs[2]) : DType::f32;
  return s;
}

ClassifierOutputs classifier_outputs(const Op& op) {
  ClassifierOutputs o;
  o.losses = op.outputs[0] != kNoTensor;
  if (op.kind == OpKind::classifier) {
    o.dx = op.outputs[1] != kNoTensor;
    o.dwte = op.outputs[2] != kNoTensor;
    o.dx_modes = WriteVariants::of(op.modes[1]);
    o.dwte_modes = WriteVariants::of(op.modes[2]);
  }
  return o;
}

}  // namespace

uint64_t classifier_scratch_bytes(const DnnlEnv& env, const Program& p, const Op& op) {
  return ClassifierKernel::scratch_bytes(env, classifier_shape(p, op), classifier_outputs(op));
}

Prepared prepare_classifier(const DnnlEnv& env, const Program& p, const Op& op, const OpBinding& b) {
  const bool train = op.kind == OpKind::classifier;
  const float grad_scale = attrs_of<ClassifierAttrs>(op).grad_scale;
  ClassifierKernel kernel(env, classifier_shape(p, op), classifier_outputs(op));
  kernel.bind(b.inputs[0], b.inputs[1], in_i(b, 2), out_f(b, 0), train ? b.outputs[1] : nullptr,
              train ? b.outputs[2] : nullptr, static_cast<float*>(b.workspace[0]), scratch_of(p, op, b));
  const WriteMode m1 = train ? op.modes[1] : WriteMode::overwrite, m2 = train ? op.modes[2] : WriteMode::overwrite;
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
