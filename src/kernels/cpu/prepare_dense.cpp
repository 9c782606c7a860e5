// CPU prepare functions of the dense and elementwise kinds: embedding, matmul (oneDNN),
// bias_grad, gelu, swiglu, add / add_bias / accumulate / cast, and fill. The op contract has been checked
// (kernels/op_contract.hpp); what remains is picking a kernel instantiation from the dtypes.
#include <cstring>

#include "kernels/cpu/cpu_prepare.hpp"
#include "kernels/cpu/columns.hpp"
#include "kernels/cpu/elementwise.hpp"
#include "core/dropout_mask.hpp"
#include "kernels/cpu/embedding.hpp"
#include "kernels/cpu/gelu.hpp"
#include "kernels/cpu/matmul.hpp"
#include "kernels/cpu/reduce.hpp"
#include "kernels/cpu/swiglu.hpp"

namespace memfit::cpu {
namespace {

// fp32 throughout, or bf16 A and B with a bf16 or fp32 bias and C.
MatmulTypes matmul_types(const Program& p, const Op& op) {
  MatmulTypes t{dtype_of(p, op.inputs[0]), dtype_of(p, op.inputs[1]),
                op.inputs.size() == 3 ? dtype_of(p, op.inputs[2]) : DType::f32, dtype_of(p, op.outputs[0])};
  const bool fp32 = t.a == DType::f32 && t.b == DType::f32 && t.bias == DType::f32 && t.c == DType::f32;
  auto bf16_or_f32 = [](DType x) { return x == DType::bf16 || x == DType::f32; };
  const bool bf16 = t.a == DType::bf16 && t.b == DType::bf16 && bf16_or_f32(t.bias) && bf16_or_f32(t.c);
  if (!fp32 && !bf16) no_cpu_kernel(op, t.a == DType::f32 ? t.b : t.a);
  return t;
}

Prepared prepare_embedding_forward(const Program& p, const Op& op, const OpBinding& b) {
  const bool has_wpe = op.inputs.size() == 3;  // rotary models have no position table
  const TensorDesc& tokens = p.tensor(op.inputs[0]);
  const TensorDesc& wte = p.tensor(op.inputs[1]);
  const int64_t N = tokens.numel(), seq = tokens.shape.last(), C = wte.shape.last(), Vp = wte.shape.rows();
  const EmbeddingSlice slice = embedding_slice(op);
  const bool add_wpe = has_wpe && slice.add_positions;
  Prepared out;
  dispatch_t(op, wte.dtype, [&](auto t) {
    using T = decltype(t);
    out = make_op([=, tok = in_i(b, 0), wte = in_t<T>(b, 1), wpe = add_wpe ? in_t<T>(b, 2) : nullptr,
                   x = out_t<T>(b, 0), mode = op.modes[0]](const StepContext& ctx) {
      embedding_forward(tok, wte, wpe, x, N, seq, C, Vp, accumulates(mode, ctx), slice.vocab_begin, slice.sliced);
    });
  });
  return out;
}

Prepared prepare_embedding_backward(const Program& p, const Op& op, const OpBinding& b) {
  const bool has_wpe = op.outputs.size() == 2;  // rotary models have no position table
  const TensorDesc& tokens = p.tensor(op.inputs[1]);
  const int64_t N = tokens.numel(), seq = tokens.shape.last();
  const int64_t C = p.tensor(op.inputs[0]).shape.last();
  const TensorId dwpe_id = has_wpe ? op.outputs[1] : kNoTensor;
  const int64_t Vp = op.outputs[0] != kNoTensor ? p.tensor(op.outputs[0]).shape.rows() : 0;
  const int64_t Tmax = dwpe_id != kNoTensor ? p.tensor(dwpe_id).shape.rows() : 0;
  const DType g = op.outputs[0] != kNoTensor ? dtype_of(p, op.outputs[0]) : dtype_of(p, dwpe_id);
  const EmbeddingSlice slice = embedding_slice(op);
  Prepared out;
  dispatch_tg(op, dtype_of(p, op.inputs[0]), g, [&](auto t, auto gt) {
    using T = decltype(t);
    using G = decltype(gt);
    out = make_op([=, dx = in_t<T>(b, 0), tok = in_i(b, 1), dwte = out_t<G>(b, 0),
                   dwpe = has_wpe ? out_t<G>(b, 1) : nullptr, m0 = op.modes[0],
                   m1 = has_wpe ? op.modes[1] : WriteMode::overwrite](const StepContext& ctx) {
      embedding_backward(dx, tok, dwte, dwpe, N, seq, C, Vp, Tmax, accumulates(m0, ctx), accumulates(m1, ctx),
                         slice.vocab_begin, slice.sliced);
    });
  });
  return out;
}

Prepared prepare_swiglu(const Program& p, const Op& op, const OpBinding& b) {
  const bool fwd = op.kind == OpKind::swiglu_forward;
  const TensorDesc& gate = p.tensor(op.inputs[fwd ? 0 : 1]);
  const int64_t n = gate.numel();
  Prepared out;
  dispatch_t(op, gate.dtype, [&](auto t) {
    using T = decltype(t);
    if (fwd)
      out = make_op([=, g = in_t<T>(b, 0), u = in_t<T>(b, 1), y = out_t<T>(b, 0)](const StepContext&) {
        swiglu_forward(g, u, y, n);
      });
    else
      out = make_op([=, dy = in_t<T>(b, 0), g = in_t<T>(b, 1), u = in_t<T>(b, 2), dg = out_t<T>(b, 0),
                     du = out_t<T>(b, 1), m0 = op.modes[0], m1 = op.modes[1]](const StepContext& ctx) {
        swiglu_backward(dy, g, u, dg, du, n, accumulates(m0, ctx), accumulates(m1, ctx));
      });
  });
  return out;
}

Prepared prepare_gelu(const Program& p, const Op& op, const OpBinding& b) {
  const bool fwd = op.kind == OpKind::gelu_forward;
  const int64_t n = p.tensor(op.outputs[0]).numel();
  Prepared out;
  dispatch_t(op, dtype_of(p, op.outputs[0]), [&](auto t) {
    using T = decltype(t);
    if (fwd)
      out = make_op([=, x = in_t<T>(b, 0), y = out_t<T>(b, 0), mode = op.modes[0]](const StepContext& ctx) {
        gelu_forward(x, y, n, accumulates(mode, ctx));
      });
    else
      out = make_op([=, dy = in_t<T>(b, 0), x = in_t<T>(b, 1), dx = out_t<T>(b, 0), mode = op.modes[0]](
                        const StepContext& ctx) { gelu_backward(dy, x, dx, n, accumulates(mode, ctx)); });
  });
  return out;
}

// add and add_bias: all tensors of one type. accumulate and cast: y (+)= x between any two float types.
Prepared prepare_columns(const Program& p, const Op& op, const OpBinding& b) {
  const ColumnsAttrs a = attrs_of<ColumnsAttrs>(op);
  Prepared out;
  dispatch_t(op, dtype_of(p, op.outputs[0]), [&](auto t) {
    using T = decltype(t);
    if (op.kind == OpKind::add_columns)
      out = make_op([=, x = in_t<T>(b, 0), d = in_t<T>(b, 1), y = out_t<T>(b, 0), mode = op.modes[0]](
                        const StepContext& ctx) {
        add_columns_forward(x, d, y, a.rows, a.cols, a.begin, a.width, accumulates(mode, ctx));
      });
    else
      out = make_op([=, x = in_t<T>(b, 0), y = out_t<T>(b, 0), mode = op.modes[0]](const StepContext& ctx) {
        slice_columns_forward(x, y, a.rows, a.cols, a.begin, a.width, accumulates(mode, ctx));
      });
  });
  return out;
}

Prepared prepare_dropout(const Program& p, const Op& op, const OpBinding& b) {
  const DropoutAttrs a = attrs_of<DropoutAttrs>(op);
  const int64_t n = p.tensor(op.outputs[0]).numel();
  Prepared out;
  dispatch_t(op, dtype_of(p, op.outputs[0]), [&](auto t) {
    using T = decltype(t);
    out = make_op([=, x = in_t<T>(b, 0), y = out_t<T>(b, 0), mode = op.modes[0]](const StepContext& ctx) {
      dropout_apply(x, y, n, a.p, dropout_key(ctx.seed, ctx.step, ctx.micro, a.salt), a.layout, accumulates(mode, ctx));
    });
  });
  return out;
}

Prepared prepare_elementwise(const Program& p, const Op& op, const OpBinding& b) {
  const int64_t n = p.tensor(op.outputs[0]).numel();
  const DType ty = dtype_of(p, op.outputs[0]);
  Prepared out;
  if (op.kind == OpKind::add_bias) {
    const int64_t cols = p.tensor(op.inputs[1]).numel(), rows = n / cols;
    dispatch_t(op, ty, [&](auto t) {
      using T = decltype(t);
      out = make_op([=, x = in_t<T>(b, 0), bias = in_t<T>(b, 1), y = out_t<T>(b, 0),
                     mode = op.modes[0]](const StepContext& ctx) {
        add_bias_forward(x, bias, y, rows, cols, accumulates(mode, ctx));
      });
    });
    return out;
  }
  if (op.kind == OpKind::add) {
    dispatch_t(op, ty, [&](auto t) {
      using T = decltype(t);
      out = make_op([=, a = in_t<T>(b, 0), bb = in_t<T>(b, 1), y = out_t<T>(b, 0),
                     mode = op.modes[0]](const StepContext& ctx) { add_forward(a, bb, y, n, accumulates(mode, ctx)); });
    });
    return out;
  }
  dispatch_t(op, dtype_of(p, op.inputs[0]), [&](auto xt) {
    dispatch_t(op, ty, [&](auto yt) {
      using X = decltype(xt);
      using Y = decltype(yt);
      out = make_op([=, x = in_t<X>(b, 0), y = out_t<Y>(b, 0), mode = op.modes[0]](const StepContext& ctx) {
        accumulate_forward(x, y, n, accumulates(mode, ctx));
      });
    });
  });
  return out;
}

}  // namespace

Prepared prepare_embedding(const Program& p, const Op& op, const OpBinding& b) {
  if (op.kind == OpKind::embedding_forward) return prepare_embedding_forward(p, op, b);
  return prepare_embedding_backward(p, op, b);
}

uint64_t matmul_scratch_bytes(const DnnlEnv& env, const Program& p, const Op& op) {
  return MatmulKernel::scratch_bytes(env, attrs_of<MatmulAttrs>(op), op.inputs.size() == 3,
                                     WriteVariants::of(op.modes.at(0)), matmul_types(p, op));
}

Prepared prepare_matmul(const DnnlEnv& env, const Program& p, const Op& op, const OpBinding& b) {
  const MatmulAttrs& a = attrs_of<MatmulAttrs>(op);
  const bool has_bias = op.inputs.size() == 3;
  MatmulKernel kernel(env, a, has_bias, WriteVariants::of(op.modes[0]), matmul_types(p, op));
  const void* B = static_cast<const std::byte*>(b.inputs[1]) + dtype_bytes(dtype_of(p, op.inputs[1]), a.b_offset);
  kernel.bind(b.inputs[0], B, has_bias ? b.inputs[2] : nullptr, b.outputs[0], scratch_of(p, op, b));
  return make_op([kernel = std::move(kernel), mode = op.modes[0]](const StepContext& ctx) {
    kernel.run(accumulates(mode, ctx));
  });
}

Prepared prepare_bias_grad(const Program& p, const Op& op, const OpBinding& b) {
  const int64_t N = p.tensor(op.outputs[0]).numel(), M = p.tensor(op.inputs[0]).numel() / N;
  Prepared out;
  dispatch_tg(op, dtype_of(p, op.inputs[0]), dtype_of(p, op.outputs[0]), [&](auto t, auto gt) {
    using T = decltype(t);
    using G = decltype(gt);
    out = make_op([=, dy = in_t<T>(b, 0), db = out_t<G>(b, 0), mode = op.modes[0]](const StepContext& ctx) {
      bias_grad(dy, db, M, N, accumulates(mode, ctx));
    });
  });
  return out;
}

Prepared prepare_pointwise(const Program& p, const Op& op, const OpBinding& b) {
  switch (op.kind) {
    case OpKind::gelu_forward:
    case OpKind::gelu_backward: return prepare_gelu(p, op, b);
    case OpKind::swiglu_forward:
    case OpKind::swiglu_backward: return prepare_swiglu(p, op, b);
    case OpKind::add_columns:
    case OpKind::slice_columns: return prepare_columns(p, op, b);
    case OpKind::dropout_forward:
    case OpKind::dropout_backward: return prepare_dropout(p, op, b);
    default: return prepare_elementwise(p, op, b);
  }
}

Prepared prepare_fill(const Program& p, const Op& op, const OpBinding& b) {
  const int64_t n = p.tensor(op.outputs[0]).numel();
  const float value = attrs_of<FillAttrs>(op).value;
  if (p.tensor(op.outputs[0]).dtype != DType::f32 && value == 0.0f && op.modes[0] == WriteMode::overwrite) {
    // Zero is all-zero bits in every float type (ZeRO zeroes the padding of 16-bit buckets).
    return make_op([x = b.outputs[0], bytes = p.tensor(op.outputs[0]).bytes()](const StepContext&) {
      std::memset(x, 0, bytes);
    });
  }
  if (p.tensor(op.outputs[0]).dtype != DType::f32) no_cpu_kernel(op, p.tensor(op.outputs[0]).dtype);
  return make_op([=, x = out_f(b, 0), mode = op.modes[0]](const StepContext& ctx) {
    fill_forward(x, n, value, accumulates(mode, ctx));
  });
}

}  // namespace memfit::cpu
