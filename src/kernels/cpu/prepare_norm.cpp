// CPU prepare functions of the normalisations: layernorm and rmsnorm, forward and backward.
// Storage may be any float type with fp32 statistics; weight gradients are the storage type
// or fp32 (dispatch_tg).
#include "kernels/cpu/cpu_prepare.hpp"
#include "kernels/cpu/layernorm.hpp"
#include "kernels/cpu/rmsnorm.hpp"

namespace memfit::cpu {
namespace {

Prepared prepare_layernorm_forward(const Program& p, const Op& op, const OpBinding& b) {
  const TensorDesc& x = p.tensor(op.inputs[0]);
  const int64_t C = x.shape.last(), N = x.numel() / C;
  const float eps = attrs_of<NormAttrs>(op).eps;
  Prepared out;
  dispatch_t(op, x.dtype, [&](auto t) {
    using T = decltype(t);
    out = make_op([=, x = in_t<T>(b, 0), w = in_t<T>(b, 1), bias = in_t<T>(b, 2), y = out_t<T>(b, 0),
                   mean = out_f(b, 1), rstd = out_f(b, 2)](const StepContext&) {
      layernorm_forward(x, w, bias, y, mean, rstd, N, C, eps);
    });
  });
  return out;
}

Prepared prepare_layernorm_backward(const Program& p, const Op& op, const OpBinding& b) {
  const TensorDesc& x = p.tensor(op.inputs[1]);
  const int64_t C = x.shape.last(), N = x.numel() / C;
  const DType g = op.outputs[1] != kNoTensor ? dtype_of(p, op.outputs[1]) : dtype_of(p, op.outputs[2]);
  Prepared out;
  dispatch_tg(op, x.dtype, g, [&](auto t, auto gt) {
    using T = decltype(t);
    using G = decltype(gt);
    out = make_op([=, dy = in_t<T>(b, 0), x = in_t<T>(b, 1), w = in_t<T>(b, 2), mean = in_f(b, 3), rstd = in_f(b, 4),
                   dx = out_t<T>(b, 0), dw = out_t<G>(b, 1), db = out_t<G>(b, 2), m0 = op.modes[0], m1 = op.modes[1],
                   m2 = op.modes[2]](const StepContext& ctx) {
      layernorm_backward(dy, x, w, mean, rstd, dx, dw, db, N, C, accumulates(m0, ctx), accumulates(m1, ctx),
                         accumulates(m2, ctx));
    });
  });
  return out;
}

Prepared prepare_rmsnorm_forward(const Program& p, const Op& op, const OpBinding& b) {
  const TensorDesc& x = p.tensor(op.inputs[0]);
  const int64_t C = x.shape.last(), N = x.numel() / C;
  const float eps = attrs_of<NormAttrs>(op).eps;
  Prepared out;
  dispatch_t(op, x.dtype, [&](auto t) {
    using T = decltype(t);
    out = make_op([=, x = in_t<T>(b, 0), w = in_t<T>(b, 1), y = out_t<T>(b, 0), rstd = out_f(b, 1)](
                      const StepContext&) { rmsnorm_forward(x, w, y, rstd, N, C, eps); });
  });
  return out;
}

Prepared prepare_rmsnorm_backward(const Program& p, const Op& op, const OpBinding& b) {
  const TensorDesc& x = p.tensor(op.inputs[1]);
  const int64_t C = x.shape.last(), N = x.numel() / C;
  const DType g = op.outputs[1] != kNoTensor ? dtype_of(p, op.outputs[1]) : DType::f32;
  Prepared out;
  dispatch_tg(op, x.dtype, g, [&](auto t, auto gt) {
    using T = decltype(t);
    using G = decltype(gt);
    out = make_op([=, dy = in_t<T>(b, 0), x = in_t<T>(b, 1), w = in_t<T>(b, 2), rstd = in_f(b, 3), dx = out_t<T>(b, 0),
                   dw = out_t<G>(b, 1), m0 = op.modes[0], m1 = op.modes[1]](const StepContext& ctx) {
      rmsnorm_backward(dy, x, w, rstd, dx, dw, N, C, accumulates(m0, ctx), accumulates(m1, ctx));
    });
  });
  return out;
}

}  // namespace

Prepared prepare_norm(const Program& p, const Op& op, const OpBinding& b) {
  switch (op.kind) {
    case OpKind::layernorm_forward: return prepare_layernorm_forward(p, op, b);
    case OpKind::layernorm_backward: return prepare_layernorm_backward(p, op, b);
    case OpKind::rmsnorm_forward: return prepare_rmsnorm_forward(p, op, b);
    default: return prepare_rmsnorm_backward(p, op, b);
  }
}

}  // namespace memfit::cpu
