// The CPU backend: turns each op of a program into a PreparedOp bound to fixed addresses.
// prepare() checks the op contract (kernels/op_contract.hpp), then hands the op to the
// prepare function of its family (cpu_prepare.hpp), which builds the oneDNN primitives and
// captures everything a run needs in a closure, so that run() is a direct call into a kernel:
// no lookups, no allocation in memfit code.
//
// Subtle point: write modes are resolved at run time (accumulate_after_first_micro flips
// between micro-steps), so a kernel whose products are oneDNN primitives gets every variant
// its mode can take at prepare time, and scratch_bytes() builds exactly the same set of
// primitive descriptors to size the scratch the plan reserves.
//
// Dtypes: the contract admits fp32, bf16 and fp16 in every float slot; each prepare function
// picks its kernel instantiation from the tensors' dtypes (dispatch_t / _tg) and refuses,
// naming the op, a combination it has no kernel for. cpu_capabilities() declares what exists,
// and the precision pass (graph/precision.hpp) builds programs from that table.
#include "core/error.hpp"
#include "kernels/backend.hpp"
#include "kernels/cpu/comm_codec.hpp"
#include "kernels/cpu/grad_codec.hpp"
#include "kernels/cpu/cpu_prepare.hpp"
#include "kernels/op_contract.hpp"

namespace memfit {
namespace {

using namespace cpu;

OpCapabilities make_cpu_capabilities() {
  OpCapabilities c("CPU");
  for (OpKind k : kComputeOpKinds) c.allow(k, {DType::f32});
  // Storage of any float type, arithmetic in fp32 inside (per element or per tile).
  c.allow({OpKind::embedding_forward, OpKind::embedding_backward, OpKind::layernorm_forward,
           OpKind::layernorm_backward, OpKind::rmsnorm_forward, OpKind::rmsnorm_backward, OpKind::rope_forward,
           OpKind::rope_backward, OpKind::swiglu_forward, OpKind::swiglu_backward, OpKind::bias_grad,
           OpKind::gelu_forward, OpKind::gelu_backward, OpKind::add, OpKind::add_bias, OpKind::add_columns,
           OpKind::slice_columns,
           OpKind::dropout_forward, OpKind::dropout_backward, OpKind::accumulate, OpKind::loss_mean,
           OpKind::cast, OpKind::check_finite, OpKind::flash_attention_forward, OpKind::flash_attention_backward,
           OpKind::grad_norm, OpKind::adamw, OpKind::adamw8bit, OpKind::load_input, OpKind::dora_norm,
           OpKind::dora_scale, OpKind::dora_scale_backward, OpKind::dora_blend, OpKind::dora_blend_backward},
          {DType::bf16, DType::f16});
  c.allow(OpKind::load_input, {DType::f32});
  c.allow({OpKind::comm_quantize, OpKind::comm_dequantize}, {DType::f32, DType::bf16, DType::f16});
  c.allow({OpKind::grad_quantize, OpKind::grad_dequantize_sum}, {DType::f32, DType::bf16, DType::f16});
  c.allow({OpKind::embedding_at, OpKind::cached_attention}, {DType::f32, DType::bf16, DType::f16});
  // Products: oneDNN 2.6 offers bf16 matmuls on CPUs (AMX / AVX512-BF16), no f16 ones.
  c.allow({OpKind::matmul, OpKind::attention_forward, OpKind::attention_backward, OpKind::classifier,
           OpKind::classifier_eval, OpKind::classifier_partial, OpKind::classifier_parallel_backward,
           OpKind::quant_linear, OpKind::quant_linear_backward},
          {DType::bf16});
  return c;
}

class CpuBackend final : public Backend {
 public:
  CpuBackend() : env_(DnnlEnv::make_cpu()) {}
  std::string_view name() const override { return "cpu"; }
  const OpCapabilities& capabilities() const override { return cpu_capabilities(); }

  // 0 for kinds (and dtypes) without a kernel: prepare() is where those fail, with the op named.
  uint64_t scratch_bytes(const Program& program, const Op& op) const override {
    try {
      check_op_contract(program, op);
      switch (op.kind) {
        case OpKind::matmul: return matmul_scratch_bytes(env_, program, op);
        case OpKind::quant_linear:
        case OpKind::quant_linear_backward: return quant_linear_scratch_bytes(env_, program, op);
        case OpKind::attention_forward:
        case OpKind::attention_backward:
        case OpKind::flash_attention_forward:
        case OpKind::flash_attention_backward: return attention_scratch_bytes(env_, program, op);
        case OpKind::classifier:
        case OpKind::classifier_eval:
        case OpKind::classifier_partial:
        case OpKind::classifier_parallel_backward: return classifier_scratch_bytes(env_, program, op);
        case OpKind::cached_attention: return cached_attention_scratch_bytes(op);
        default: return 0;
      }
    } catch (const Error&) {
      return 0;
    }
  }

  std::unique_ptr<PreparedOp> prepare(const Program& program, const Op& op, const OpBinding& binding) override {
    check_op_contract(program, op);
    check_binding(op, binding);
    const uint64_t scratch = scratch_bytes(program, op);
    if (scratch > 0) {
      const bool has = !op.workspace.empty() && program.tensor(op.workspace.back()).dtype == DType::u8;
      MEMFIT_CHECK(has && program.tensor(op.workspace.back()).bytes() >= scratch, "kernels",
                   "op '{}' needs {} bytes of library scratch as its last (uint8) workspace tensor", op.name, scratch);
    }
    if (writes_nothing(op)) return make_op([](const StepContext&) {});
    switch (op.kind) {
      case OpKind::embedding_forward:
      case OpKind::embedding_backward: return prepare_embedding(program, op, binding);
      case OpKind::layernorm_forward:
      case OpKind::layernorm_backward:
      case OpKind::rmsnorm_forward:
      case OpKind::rmsnorm_backward: return prepare_norm(program, op, binding);
      case OpKind::swiglu_forward:
      case OpKind::swiglu_backward:
      case OpKind::gelu_forward:
      case OpKind::gelu_backward:
      case OpKind::add:
      case OpKind::add_bias:
      case OpKind::add_columns:
      case OpKind::slice_columns:
      case OpKind::dropout_forward:
      case OpKind::dropout_backward:
      case OpKind::accumulate:
      case OpKind::cast: return prepare_pointwise(program, op, binding);
      case OpKind::rope_forward:
      case OpKind::rope_backward: return prepare_rope(program, op, binding);
      case OpKind::matmul: return prepare_matmul(env_, program, op, binding);
      case OpKind::quant_linear:
      case OpKind::quant_linear_backward: return prepare_quant_linear(env_, program, op, binding);
      case OpKind::bias_grad: return prepare_bias_grad(program, op, binding);
      case OpKind::dora_norm:
      case OpKind::dora_scale:
      case OpKind::dora_scale_backward:
      case OpKind::dora_blend:
      case OpKind::dora_blend_backward: return prepare_dora(program, op, binding);
      case OpKind::attention_forward:
      case OpKind::attention_backward: return prepare_attention(env_, program, op, binding);
      case OpKind::flash_attention_forward:
      case OpKind::flash_attention_backward: return prepare_flash_attention(program, op, binding);
      case OpKind::classifier:
      case OpKind::classifier_eval:
      case OpKind::classifier_partial:
      case OpKind::classifier_combine:
      case OpKind::classifier_parallel_backward: return prepare_classifier(env_, program, op, binding);
      case OpKind::loss_mean: return prepare_loss_mean(program, op, binding);
      case OpKind::adamw: return prepare_adamw(program, op, binding);
      case OpKind::adamw8bit: return prepare_adamw8bit(program, op, binding);
      case OpKind::grad_norm: return prepare_grad_norm(program, op, binding);
      case OpKind::check_finite: return prepare_check_finite(program, op, binding);
      case OpKind::fill: return prepare_fill(program, op, binding);
      case OpKind::embedding_at: return prepare_embedding_at(program, op, binding);
      case OpKind::cached_attention: return prepare_cached_attention(program, op, binding);
      case OpKind::comm_quantize:
      case OpKind::comm_dequantize: return prepare_comm_codec(program, op, binding);
      case OpKind::grad_quantize:
      case OpKind::grad_dequantize_sum: return prepare_grad_codec(program, op, binding);
      default: no_cpu_kernel(op, op_storage_dtype(program, op));
    }
  }

 private:
  DnnlEnv env_;
};

}  // namespace

const OpCapabilities& cpu_capabilities() {
  static const OpCapabilities caps = make_cpu_capabilities();
  return caps;
}

std::unique_ptr<Backend> make_cpu_backend() { return std::make_unique<CpuBackend>(); }

}  // namespace memfit
