// The reference backend: every op of a training program run by the naive kernels of this
// folder (plain loops, double accumulation, fp32 storage). It shares nothing with the CPU
// backend but the op contract (kernels/op_contract.hpp), so the same program and op tests run
// on both and disagreements point at one side. Slow by design: an oracle, not a way to train.
//
// Capabilities: fp32 for every compute kind except check_finite (fp16 runs only); flash
// attention has its naive form (reference_flash_attention.cpp), so both attention kinds run.
// No library scratch (scratch_bytes is 0). Subtle point: the naive attention, classifier and
// 8-bit AdamW kernels hold a row, the logits of a row or a block in std::vectors, so a step on
// this backend allocates host memory outside the plan; the plan (the arenas) is still exact.
#include <cmath>
#include <vector>

#include "kernels/backend.hpp"
#include "kernels/closure_op.hpp"
#include "core/dropout_mask.hpp"
#include "kernels/op_contract.hpp"
#include "kernels/reference/reference.hpp"
#include "kernels/reference/reference_dora.hpp"
#include "kernels/reference/reference_kv_cache.hpp"
#include "kernels/reference/reference_llama.hpp"
#include "kernels/reference/reference_optimizer.hpp"
#include "kernels/reference/reference_quant.hpp"

namespace memfit {
namespace {

using Prepared = std::unique_ptr<PreparedOp>;
const float* in(const OpBinding& b, size_t i) { return static_cast<const float*>(b.inputs[i]); }
const int32_t* in_i(const OpBinding& b, size_t i) { return static_cast<const int32_t*>(b.inputs[i]); }
float* out(const OpBinding& b, size_t j) { return static_cast<float*>(b.outputs[j]); }

OpCapabilities make_reference_capabilities() {
  OpCapabilities c("reference");
  for (OpKind k : kComputeOpKinds)
    if (k != OpKind::check_finite) c.allow(k, {DType::f32});
  c.allow({OpKind::embedding_at, OpKind::cached_attention}, {DType::f32});
  return c;
}

// What every gradient of an update op is multiplied by: the clipping coefficient over the loss scale.
double update_grad_scale(const float* norm, double max_grad_norm, const StepContext& ctx) {
  const double clip = norm && max_grad_norm > 0 ? std::min(1.0, max_grad_norm / (double(*norm) + 1e-6)) : 1.0;
  return clip / double(ctx.loss_scale);
}

Prepared prepare_dense(const Program& p, const Op& op, const OpBinding& b) {
  const WriteMode m0 = op.modes.empty() ? WriteMode::overwrite : op.modes[0];
  const int64_t n0 = op.outputs.empty() || op.outputs[0] == kNoTensor ? 0 : p.tensor(op.outputs[0]).numel();
  switch (op.kind) {
    case OpKind::embedding_forward: {
      const TensorDesc& tok = p.tensor(op.inputs[0]);
      const int64_t N = tok.numel(), T = tok.shape.last(), C = p.tensor(op.inputs[1]).shape.last();
      const EmbeddingSlice slice = embedding_slice(op);
      const int64_t rows = slice.sliced ? p.tensor(op.inputs[1]).shape.rows() : -1;
      const bool add_wpe = op.inputs.size() == 3 && slice.add_positions;
      return make_op([=, wpe = add_wpe ? in(b, 2) : nullptr](const StepContext& ctx) {
        ref::embedding_forward(in_i(b, 0), in(b, 1), wpe, out(b, 0), N, T, C, accumulates(m0, ctx), slice.vocab_begin,
                               rows);
      });
    }
    case OpKind::embedding_backward: {
      const TensorDesc& tok = p.tensor(op.inputs[1]);
      const int64_t N = tok.numel(), T = tok.shape.last(), C = p.tensor(op.inputs[0]).shape.last();
      const bool has_wpe = op.outputs.size() == 2 && op.outputs[1] != kNoTensor;
      const int64_t Vp = op.outputs[0] != kNoTensor ? p.tensor(op.outputs[0]).shape.rows() : 0;
      const int64_t Tmax = has_wpe ? p.tensor(op.outputs[1]).shape.rows() : 0;
      const WriteMode m1 = has_wpe ? op.modes[1] : WriteMode::overwrite;
      const EmbeddingSlice slice = embedding_slice(op);
      return make_op([=, dwpe = has_wpe ? out(b, 1) : nullptr](const StepContext& ctx) {
        ref::embedding_backward(in(b, 0), in_i(b, 1), out(b, 0), dwpe, N, T, C, Vp, Tmax, accumulates(m0, ctx),
                                accumulates(m1, ctx), slice.vocab_begin, slice.sliced);
      });
    }
    case OpKind::matmul: {
      const MatmulAttrs a = attrs_of<MatmulAttrs>(op);
      return make_op([=, bias = op.inputs.size() == 3 ? in(b, 2) : nullptr](const StepContext& ctx) {
        ref::matmul(in(b, 0), in(b, 1) + a.b_offset, bias, out(b, 0), a.m, a.n, a.k, a.trans_a, a.trans_b, double(a.alpha),
                    accumulates(m0, ctx));
      });
    }
    case OpKind::bias_grad: {
      const int64_t M = p.tensor(op.inputs[0]).numel() / n0;
      return make_op([=](const StepContext& ctx) { ref::bias_grad(in(b, 0), out(b, 0), M, n0, accumulates(m0, ctx)); });
    }
    case OpKind::gelu_forward:
      return make_op([=](const StepContext& ctx) { ref::gelu_forward(in(b, 0), out(b, 0), n0, accumulates(m0, ctx)); });
    case OpKind::gelu_backward:
      return make_op(
          [=](const StepContext& ctx) { ref::gelu_backward(in(b, 0), in(b, 1), out(b, 0), n0, accumulates(m0, ctx)); });
    case OpKind::swiglu_forward:
      return make_op([=](const StepContext&) { ref::swiglu_forward(in(b, 0), in(b, 1), out(b, 0), n0); });
    case OpKind::swiglu_backward: {
      const int64_t n = p.tensor(op.inputs[1]).numel();
      const WriteMode m1 = op.modes[1];
      return make_op([=](const StepContext& ctx) {
        ref::swiglu_backward(in(b, 0), in(b, 1), in(b, 2), out(b, 0), out(b, 1), n, accumulates(m0, ctx),
                             accumulates(m1, ctx));
      });
    }
    case OpKind::add:
      return make_op(
          [=](const StepContext& ctx) { ref::add(in(b, 0), in(b, 1), out(b, 0), n0, accumulates(m0, ctx)); });
    case OpKind::add_bias: {
      const int64_t cols = p.tensor(op.inputs[1]).numel();
      return make_op([=](const StepContext& ctx) {
        ref::add_bias(in(b, 0), in(b, 1), out(b, 0), n0 / cols, cols, accumulates(m0, ctx));
      });
    }
    case OpKind::add_columns: {
      const ColumnsAttrs a = attrs_of<ColumnsAttrs>(op);
      return make_op([=](const StepContext& ctx) {
        ref::add_columns(in(b, 0), in(b, 1), out(b, 0), a.rows, a.cols, a.begin, a.width, accumulates(m0, ctx));
      });
    }
    case OpKind::slice_columns: {
      const ColumnsAttrs a = attrs_of<ColumnsAttrs>(op);
      return make_op([=](const StepContext& ctx) {
        ref::slice_columns(in(b, 0), out(b, 0), a.rows, a.cols, a.begin, a.width, accumulates(m0, ctx));
      });
    }
    case OpKind::dropout_forward:
    case OpKind::dropout_backward: {
      const DropoutAttrs a = attrs_of<DropoutAttrs>(op);
      return make_op([=](const StepContext& ctx) {
        ref::dropout(in(b, 0), out(b, 0), n0, a.p, dropout_key(ctx.seed, ctx.step, ctx.micro, a.salt), a.layout,
                     accumulates(m0, ctx));
      });
    }
    case OpKind::accumulate:
    case OpKind::cast:  // fp32 to fp32: a copy
      return make_op([=](const StepContext& ctx) { ref::accumulate(in(b, 0), out(b, 0), n0, accumulates(m0, ctx)); });
    case OpKind::fill: {
      const double value = attrs_of<FillAttrs>(op).value;
      return make_op([=](const StepContext& ctx) { ref::fill(out(b, 0), n0, value, accumulates(m0, ctx)); });
    }
    default: no_kernel("reference", op, op_storage_dtype(p, op));
  }
}

// rope: the naive rotation reads each pair before writing it, so y may be x (in place).
Prepared prepare_rope(const Op& op, const OpBinding& b) {
  const AttentionAttrs a = attrs_of<AttentionAttrs>(op);
  const int64_t kv = a.kv_heads > 0 ? a.kv_heads : a.heads;
  const bool forward = op.kind == OpKind::rope_forward;
  return make_op([=](const StepContext&) {
    if (forward) ref::rope_forward(in(b, 0), out(b, 0), a.batch, a.seq, a.heads, kv, a.head_dim, a.rope_theta,
                                 a.rope_scaling);
    else ref::rope_backward(in(b, 0), out(b, 0), a.batch, a.seq, a.heads, kv, a.head_dim, a.rope_theta, a.rope_scaling);
  });
}

Prepared prepare_norm(const Program& p, const Op& op, const OpBinding& b) {
  const bool fwd = op.kind == OpKind::layernorm_forward || op.kind == OpKind::rmsnorm_forward;
  const TensorDesc& x = p.tensor(op.inputs[fwd ? 0 : 1]);
  const int64_t C = x.shape.last(), N = x.numel() / C;
  const WriteMode m0 = op.modes[0], m1 = op.modes[1], m2 = op.modes.size() > 2 ? op.modes[2] : WriteMode::overwrite;
  switch (op.kind) {
    case OpKind::layernorm_forward: {
      const double eps = attrs_of<NormAttrs>(op).eps;
      return make_op([=](const StepContext&) {
        ref::layernorm_forward(in(b, 0), in(b, 1), in(b, 2), out(b, 0), out(b, 1), out(b, 2), N, C, eps);
      });
    }
    case OpKind::layernorm_backward:
      return make_op([=](const StepContext& ctx) {
        ref::layernorm_backward(in(b, 0), in(b, 1), in(b, 2), in(b, 3), in(b, 4), out(b, 0), out(b, 1), out(b, 2), N, C,
                                accumulates(m0, ctx), accumulates(m1, ctx), accumulates(m2, ctx));
      });
    case OpKind::rmsnorm_forward: {
      const double eps = attrs_of<NormAttrs>(op).eps;
      return make_op(
          [=](const StepContext&) { ref::rmsnorm_forward(in(b, 0), in(b, 1), out(b, 0), out(b, 1), N, C, eps); });
    }
    default:
      return make_op([=](const StepContext& ctx) {
        ref::rmsnorm_backward(in(b, 0), in(b, 1), in(b, 2), in(b, 3), out(b, 0), out(b, 1), N, C, accumulates(m0, ctx),
                              accumulates(m1, ctx));
      });
  }
}

Prepared prepare_attention(const Op& op, const OpBinding& b) {
  const AttentionAttrs a = attrs_of<AttentionAttrs>(op);
  const double scale = a.scale;
  const WriteMode m0 = op.modes[0];
  switch (op.kind) {
    case OpKind::attention_forward:
      return make_op([=](const StepContext& ctx) {
        ref::attention_forward(in(b, 0), out(b, 0), out(b, 1), a.batch, a.seq, a.heads, a.head_dim, scale,
                               accumulates(m0, ctx), a.kv_heads);
      });
    case OpKind::attention_backward:
      return make_op([=](const StepContext& ctx) {
        ref::attention_backward(in(b, 0), in(b, 1), in(b, 2), out(b, 0), a.batch, a.seq, a.heads, a.head_dim, scale,
                                accumulates(m0, ctx), a.kv_heads);
      });
    case OpKind::flash_attention_forward:
      return make_op([=](const StepContext&) {
        ref::flash_attention_forward(in(b, 0), out(b, 0), out(b, 1), a.batch, a.seq, a.heads, a.head_dim, scale,
                                     a.kv_heads);
      });
    default:
      return make_op([=](const StepContext& ctx) {
        ref::flash_attention_backward(in(b, 0), in(b, 1), in(b, 2), in(b, 3), out(b, 0), a.batch, a.seq, a.heads,
                                      a.head_dim, scale, accumulates(m0, ctx), a.kv_heads);
      });
  }
}

Prepared prepare_loss(const Program& p, const Op& op, const OpBinding& b) {
  if (op.kind == OpKind::loss_mean) {
    const int64_t n = p.tensor(op.inputs[0]).numel();
    const double scale = attrs_of<ScaleAttrs>(op).scale;
    const WriteMode m0 = op.modes[0];
    return make_op(
        [=](const StepContext& ctx) { ref::loss_mean(in(b, 0), out(b, 0), n, scale, accumulates(m0, ctx)); });
  }
  const ClassifierAttrs a = attrs_of<ClassifierAttrs>(op);
  if (op.kind == OpKind::classifier_combine)
    return make_op([=](const StepContext&) { ref::classifier_combine(in(b, 0), out(b, 0), out(b, 1), a.parts, a.rows); });
  const TensorDesc& wte = p.tensor(op.inputs[1]);
  const int64_t C = wte.shape.last(), Vp = wte.shape.rows();
  if (op.kind == OpKind::classifier_partial)
    return make_op([=](const StepContext&) {
      ref::classifier_partial(in(b, 0), in(b, 1), in_i(b, 2), out(b, 0), a.rows, C, a.vocab, Vp, a.vocab_begin);
    });
  if (op.kind == OpKind::classifier_parallel_backward) {
    const WriteMode m0 = op.modes[0], m1 = op.modes[1];
    return make_op([=](const StepContext& ctx) {
      ref::classifier_parallel_backward(in(b, 0), in(b, 1), in_i(b, 2), in(b, 3), out(b, 0), out(b, 1), a.rows, C,
                                        a.vocab, Vp, a.vocab_begin, double(a.grad_scale) * double(ctx.loss_scale),
                                        accumulates(m0, ctx), accumulates(m1, ctx));
    });
  }
  const bool train = op.kind == OpKind::classifier;
  const WriteMode m1 = train ? op.modes[1] : WriteMode::overwrite, m2 = train ? op.modes[2] : WriteMode::overwrite;
  return make_op([=, dx = train ? out(b, 1) : nullptr, dwte = train ? out(b, 2) : nullptr](const StepContext& ctx) {
    ref::classifier(in(b, 0), in(b, 1), in_i(b, 2), out(b, 0), dx, dwte, a.rows, C, a.vocab, Vp,
                    double(a.grad_scale) * double(ctx.loss_scale), accumulates(m1, ctx), accumulates(m2, ctx));
  });
}

Prepared prepare_optimizer(const Program& p, const Op& op, const OpBinding& b) {
  if (op.kind == OpKind::grad_norm) {
    const GradNormAttrs::Form form = attrs_of<GradNormAttrs>(op).form;
    if (form == GradNormAttrs::Form::sqrt_of_input)
      return make_op([=](const StepContext&) { *out(b, 0) = float(std::sqrt(double(*in(b, 0)))); });
    std::vector<const float*> grads;
    std::vector<int64_t> numel;
    for (size_t i = 0; i < op.inputs.size(); ++i) {
      grads.push_back(in(b, i));
      numel.push_back(p.tensor(op.inputs[i]).numel());
    }
    return make_op([=](const StepContext& ctx) {
      const double norm = ref::global_norm(grads, numel) / double(ctx.loss_scale);
      *out(b, 0) = float(form == GradNormAttrs::Form::sum_of_squares ? norm * norm : norm);
    });
  }
  const AdamWAttrs a = attrs_of<AdamWAttrs>(op);
  const bool eight = op.kind == OpKind::adamw8bit;
  const size_t n = op.outputs.size() / (eight ? 5 : 3);
  std::vector<int64_t> numel;
  for (size_t i = 0; i < n; ++i) numel.push_back(p.tensor(op.inputs[i]).numel());
  const float* norm = a.max_grad_norm > 0 ? in(b, op.inputs.size() - 1) : nullptr;
  return make_op([=](const StepContext& ctx) {
    const double g = update_grad_scale(norm, a.max_grad_norm, ctx);
    for (size_t i = 0; i < n; ++i) {
      const double wd = a.weight_decay.empty() ? 0.0 : a.weight_decay[i];
      if (eight)
        ref::adamw8bit(out(b, i), in(b, i), static_cast<uint8_t*>(b.outputs[i + n]),
                       static_cast<uint8_t*>(b.outputs[i + 2 * n]), out(b, i + 3 * n), out(b, i + 4 * n), numel[i],
                       a.block, ctx.lr, a.beta1, a.beta2, a.eps, wd, ctx.step, g);
      else
        ref::adamw(out(b, i), in(b, i), out(b, i + n), out(b, i + 2 * n), numel[i], ctx.lr, a.beta1, a.beta2, a.eps, wd,
                   ctx.step, g);
    }
  });
}

Prepared prepare_generation(const Program& p, const Op& op, const OpBinding& b) {
  if (op.kind == OpKind::embedding_at) {
    const TensorDesc& tok = p.tensor(op.inputs[0]);
    const int64_t T = tok.shape.last(), B = tok.numel() / T, C = p.tensor(op.inputs[1]).shape.last();
    const int64_t Tmax = op.inputs.size() == 3 ? p.tensor(op.inputs[2]).shape.rows() : INT64_MAX / 2;
    return make_op([=, wpe = op.inputs.size() == 3 ? in(b, 2) : nullptr](const StepContext& ctx) {
      MEMFIT_CHECK(ctx.position >= 0 && ctx.position + T <= Tmax, "kernels", "embedding: positions beyond the table");
      ref::embedding_at(in_i(b, 0), in(b, 1), wpe, out(b, 0), B, T, C, ctx.position);
    });
  }
  const CachedAttentionAttrs a = attrs_of<CachedAttentionAttrs>(op);
  return make_op([=](const StepContext& ctx) {
    ref::cached_attention(in(b, 0), out(b, 0), out(b, 1), out(b, 2), a, a.rope, ctx.position);
  });
}

class ReferenceBackend final : public Backend {
 public:
  std::string_view name() const override { return "reference"; }
  const OpCapabilities& capabilities() const override { return reference_capabilities(); }
  uint64_t scratch_bytes(const Program&, const Op&) const override { return 0; }

  Prepared prepare(const Program& program, const Op& op, const OpBinding& binding) override {
    check_op_contract(program, op);
    check_binding(op, binding);
    if (writes_nothing(op)) return make_op([](const StepContext&) {});
    require_capability(capabilities(), program, op);
    // The naive kernels store fp32 (integer tokens and 8-bit codes aside).
    for (const auto* list : {&op.inputs, &op.outputs})
      for (TensorId id : *list)
        if (id != kNoTensor && dtype_is_float(program.tensor(id).dtype) && program.tensor(id).dtype != DType::f32)
          no_kernel("reference", op, program.tensor(id).dtype);
    switch (op.kind) {
      case OpKind::layernorm_forward:
      case OpKind::layernorm_backward:
      case OpKind::rmsnorm_forward:
      case OpKind::rmsnorm_backward: return prepare_norm(program, op, binding);
      case OpKind::rope_forward:
      case OpKind::rope_backward: return prepare_rope(op, binding);
      case OpKind::attention_forward:
      case OpKind::attention_backward:
      case OpKind::flash_attention_forward:
      case OpKind::flash_attention_backward: return prepare_attention(op, binding);
      case OpKind::classifier:
      case OpKind::classifier_eval:
      case OpKind::classifier_partial:
      case OpKind::classifier_combine:
      case OpKind::classifier_parallel_backward:
      case OpKind::loss_mean: return prepare_loss(program, op, binding);
      case OpKind::adamw:
      case OpKind::adamw8bit:
      case OpKind::grad_norm: return prepare_optimizer(program, op, binding);
      case OpKind::quant_linear:
      case OpKind::quant_linear_backward: return ref::prepare_quant_linear(program, op, binding);
      case OpKind::embedding_at:
      case OpKind::cached_attention: return prepare_generation(program, op, binding);
      case OpKind::dora_norm:
      case OpKind::dora_scale:
      case OpKind::dora_scale_backward:
      case OpKind::dora_blend:
      case OpKind::dora_blend_backward: return ref::prepare_dora(program, op, binding);
      default: return prepare_dense(program, op, binding);
    }
  }
};

}  // namespace

const OpCapabilities& reference_capabilities() {
  static const OpCapabilities caps = make_reference_capabilities();
  return caps;
}

std::unique_ptr<Backend> make_reference_backend() { return std::make_unique<ReferenceBackend>(); }

}  // namespace memfit
