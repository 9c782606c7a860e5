// CPU prepare functions of attention: RoPE, the plain form (oneDNN products, an explicit
// T x T probability tensor; fp32 or bf16) and flash attention (tiles in fp32 in the library
// scratch, one slice per OpenMP thread; any float storage).
#include <omp.h>

#include "kernels/cpu/attention.hpp"
#include "kernels/cpu/cpu_prepare.hpp"
#include "kernels/cpu/flash_attention.hpp"
#include "kernels/cpu/rope.hpp"

namespace memfit::cpu {
namespace {

// The plain form's shape; oneDNN's products exist in fp32 and bf16 only.
AttentionShape attention_shape(const Program& p, const Op& op) {
  AttentionShape s = AttentionShape::of(attrs_of<AttentionAttrs>(op));
  s.dtype = dtype_of(p, op.inputs[op.kind == OpKind::attention_forward ? 0 : 1]);
  if (s.dtype != DType::f32 && s.dtype != DType::bf16) no_cpu_kernel(op, s.dtype);
  return s;
}

uint64_t flash_scratch_bytes(const Op& op) {
  const AttentionShape s = AttentionShape::of(attrs_of<AttentionAttrs>(op));
  const int threads = omp_get_max_threads();
  return op.kind == OpKind::flash_attention_forward ? flash_forward_scratch_bytes(s, threads)
                                                     : flash_backward_scratch_bytes(s, threads);
}

}  // namespace

uint64_t attention_scratch_bytes(const DnnlEnv& env, const Program& p, const Op& op) {
  switch (op.kind) {
    case OpKind::attention_forward:
      return AttentionForwardKernel::scratch_bytes(env, attention_shape(p, op), WriteVariants::of(op.modes.at(0)));
    case OpKind::attention_backward:
      return AttentionBackwardKernel::scratch_bytes(env, attention_shape(p, op), WriteVariants::of(op.modes.at(0)));
    default: return flash_scratch_bytes(op);
  }
}

Prepared prepare_rope(const Program& p, const Op& op, const OpBinding& b) {
  const AttentionAttrs a = attrs_of<AttentionAttrs>(op);
  const int64_t kv = a.kv_heads > 0 ? a.kv_heads : a.heads;
  const bool fwd = op.kind == OpKind::rope_forward;
  Prepared out;
  dispatch_t(op, p.tensor(op.inputs[0]).dtype, [&](auto t) {
    using T = decltype(t);
    out = make_op([=, in = in_t<T>(b, 0), y = out_t<T>(b, 0)](const StepContext&) {
      if (fwd) rope_forward(in, y, a.batch, a.seq, a.heads, kv, a.head_dim, a.rope_theta, a.rope_scaling);
      else rope_backward(in, y, a.batch, a.seq, a.heads, kv, a.head_dim, a.rope_theta, a.rope_scaling);
    });
  });
  return out;
}

Prepared prepare_attention(const DnnlEnv& env, const Program& p, const Op& op, const OpBinding& b) {
  const AttentionShape s = attention_shape(p, op);
  if (op.kind == OpKind::attention_forward) {  // y may be absent: a recomputation that needs only probs
    AttentionForwardKernel kernel(env, s, WriteVariants::of(op.modes[0]));
    kernel.bind(b.inputs[0], b.outputs[0], b.outputs[1], scratch_of(p, op, b));
    return make_op([kernel = std::move(kernel), mode = op.modes[0]](const StepContext& ctx) {
      kernel.run(accumulates(mode, ctx));
    });
  }
  AttentionBackwardKernel kernel(env, s, WriteVariants::of(op.modes[0]));
  kernel.bind(b.inputs[0], b.inputs[1], b.inputs[2], b.outputs[0], static_cast<float*>(b.workspace[0]),
              scratch_of(p, op, b));
  return make_op([kernel = std::move(kernel), mode = op.modes[0]](const StepContext& ctx) {
    kernel.run(accumulates(mode, ctx));
  });
}

Prepared prepare_flash_attention(const Program& p, const Op& op, const OpBinding& b) {
  const AttentionShape s = AttentionShape::of(attrs_of<AttentionAttrs>(op));
  const int threads = omp_get_max_threads();
  void* scratch = scratch_of(p, op, b);
  // qkv, y, dy and dqkv share one storage type (any float); lse is fp32.
  const DType ty = dtype_of(p, op.inputs[op.kind == OpKind::flash_attention_forward ? 0 : 1]);
  Prepared out;
  if (op.kind == OpKind::flash_attention_forward) {
    dispatch_t(op, ty, [&](auto t) {
      using E = decltype(t);
      out = make_op([=, qkv = in_t<E>(b, 0), y = out_t<E>(b, 0), lse = out_f(b, 1)](const StepContext&) {
        flash_attention_forward(s, qkv, y, lse, scratch, threads);
      });
    });
    return out;
  }
  dispatch_t(op, ty, [&](auto t) {
    using E = decltype(t);
    out = make_op([=, dy = in_t<E>(b, 0), qkv = in_t<E>(b, 1), y = in_t<E>(b, 2), lse = in_f(b, 3),
                   dqkv = out_t<E>(b, 0), mode = op.modes[0]](const StepContext& ctx) {
      flash_attention_backward(s, dy, qkv, y, lse, dqkv, accumulates(mode, ctx), scratch, threads);
    });
  });
  return out;
}

}  // namespace memfit::cpu
