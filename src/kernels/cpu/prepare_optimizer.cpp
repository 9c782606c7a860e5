// CPU prepare functions of the optimizer section: fused AdamW, 8-bit blockwise AdamW, the
// global gradient norm (fixed chunks, so the norm does not depend on the thread count) and
// fp16's check_finite.
#include <cmath>

#include "kernels/cpu/adamw.hpp"
#include "kernels/cpu/adamw8bit.hpp"
#include "kernels/cpu/cpu_prepare.hpp"
#include "kernels/cpu/finite.hpp"
#include "kernels/cpu/grad_norm.hpp"

namespace memfit::cpu {
namespace {

const float* clip_norm_input(const AdamWAttrs& a, const Op& op, const OpBinding& b) {
  return a.max_grad_norm > 0 ? in_f(b, op.inputs.size() - 1) : nullptr;
}

// What every gradient is multiplied by: the clipping coefficient over the loss scale.
float update_grad_scale(const float* norm, double max_grad_norm, const StepContext& ctx) {
  const float clip = norm ? clip_coefficient(*norm, max_grad_norm) : 1.0f;
  return ctx.loss_scale == 1.0f ? clip : clip / ctx.loss_scale;
}

}  // namespace

Prepared prepare_adamw(const Program& p, const Op& op, const OpBinding& b) {
  const AdamWAttrs& a = attrs_of<AdamWAttrs>(op);
  const size_t n = op.outputs.size() / 3;
  std::vector<AdamWTensor> tensors(n);
  for (size_t i = 0; i < n; ++i) {
    const int64_t numel = p.tensor(op.inputs[i]).numel();
    tensors[i] = AdamWTensor{out_f(b, i),       b.inputs[i], dtype_of(p, op.inputs[i]), out_f(b, i + n),
                             out_f(b, i + 2 * n), numel,      a.weight_decay.empty() ? 0.0f : a.weight_decay[i]};
  }
  return make_op([set = AdamWSet(std::move(tensors)), b1 = a.beta1, b2 = a.beta2, eps = a.eps,
                  norm = clip_norm_input(a, op, b), max_norm = a.max_grad_norm](const StepContext& ctx) {
    set.run(AdamWHyper{ctx.lr, b1, b2, eps, ctx.step, update_grad_scale(norm, max_norm, ctx)});
  });
}

Prepared prepare_adamw8bit(const Program& p, const Op& op, const OpBinding& b) {
  const AdamWAttrs& a = attrs_of<AdamWAttrs>(op);
  const size_t n = op.outputs.size() / 5;
  std::vector<AdamW8bitTensor> tensors(n);
  for (size_t i = 0; i < n; ++i) {
    tensors[i] = AdamW8bitTensor{out_f(b, i),
                                 b.inputs[i],
                                 static_cast<uint8_t*>(b.outputs[i + n]),
                                 static_cast<uint8_t*>(b.outputs[i + 2 * n]),
                                 out_f(b, i + 3 * n),
                                 out_f(b, i + 4 * n),
                                 p.tensor(op.inputs[i]).numel(),
                                 a.weight_decay.empty() ? 0.0f : a.weight_decay[i]};
  }
  AdamW8bitSet set(std::move(tensors), a.block, n ? p.tensor(op.inputs[0]).dtype : DType::f32);
  return make_op([set = std::move(set), b1 = a.beta1, b2 = a.beta2, eps = a.eps, norm = clip_norm_input(a, op, b),
                  max_norm = a.max_grad_norm](const StepContext& ctx) {
    set.run(AdamWHyper{ctx.lr, b1, b2, eps, ctx.step, update_grad_scale(norm, max_norm, ctx)});
  });
}

Prepared prepare_grad_norm(const Program& p, const Op& op, const OpBinding& b) {
  const GradNormAttrs::Form form = attrs_of<GradNormAttrs>(op).form;
  if (form == GradNormAttrs::Form::sqrt_of_input) {
    return make_op([in = static_cast<const float*>(b.inputs[0]), norm = out_f(b, 0)](const StepContext&) {
      *norm = std::sqrt(*in);
    });
  }
  std::vector<GradNormTensor> tensors;
  for (size_t i = 0; i < op.inputs.size(); ++i) tensors.push_back({b.inputs[i], p.tensor(op.inputs[i]).numel()});
  GradNormSet set(std::move(tensors), attrs_of<GradNormAttrs>(op).chunk,
                  op.inputs.empty() ? DType::f32 : p.tensor(op.inputs[0]).dtype);
  // The partials are per chunk of this kernel's fixed chunking.
  MEMFIT_CHECK(p.tensor(op.workspace[0]).numel() >= set.chunks(), "kernels",
               "op '{}' (grad_norm): the partials '{}' hold {} sums, fewer than {} chunks", op.name,
               p.tensor(op.workspace[0]).name, p.tensor(op.workspace[0]).numel(), set.chunks());
  return make_op([set = std::move(set), partials = static_cast<float*>(b.workspace[0]), norm = out_f(b, 0),
                  squares = form == GradNormAttrs::Form::sum_of_squares](const StepContext& ctx) {
    const float inv_scale = 1.0f / ctx.loss_scale;
    *norm = squares ? set.run_sum_of_squares(partials, inv_scale) : set.run(partials, inv_scale);
  });
}

Prepared prepare_check_finite(const Program& p, const Op& op, const OpBinding& b) {
  std::vector<FiniteSpan> spans;
  for (size_t i = 0; i < op.inputs.size(); ++i)
    spans.push_back(FiniteSpan{b.inputs[i], dtype_of(p, op.inputs[i]), p.tensor(op.inputs[i]).numel()});
  return make_op([check = FiniteCheck(std::move(spans)), flag = out_f(b, 0)](const StepContext&) {
    *flag = check.run() ? 1.0f : 0.0f;
  });
}

}  // namespace memfit::cpu
