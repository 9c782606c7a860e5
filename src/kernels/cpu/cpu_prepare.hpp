// What the CPU backend's prepare functions share: the closure that a PreparedOp runs, typed
// views of a binding's addresses, and the dispatch from tensor dtypes to kernel instantiations.
// Each prepare_* function (prepare_{dense,norm,attention,classifier,optimizer}.cpp) is called
// after check_op_contract() (kernels/op_contract.hpp) has passed, so it checks only what is
// the CPU's own: which dtype combinations have kernels (refused with no_cpu_kernel, naming the
// op), the oneDNN primitives, and the library scratch.
#pragma once

#include <memory>
#include <utility>

#include "core/half.hpp"
#include "kernels/backend.hpp"
#include "kernels/closure_op.hpp"
#include "kernels/cpu/dnnl_matmul.hpp"
#include "kernels/op_contract.hpp"

namespace memfit::cpu {

[[noreturn]] inline void no_cpu_kernel(const Op& op, DType dtype) { no_kernel("CPU", op, dtype); }

// Calls fn with a value of the storage type of t: float, bf16_t or fp16_t.
template <class Fn>
void dispatch_t(const Op& op, DType t, Fn&& fn) {
  if (!visit_float_type(t, fn)) no_cpu_kernel(op, t);
}
// The same for a (storage, gradient) pair: kernels exist for G = T and for G = float.
template <class Fn>
void dispatch_tg(const Op& op, DType t, DType g, Fn&& fn) {
  dispatch_t(op, t, [&](auto tt) {
    if (g == DType::f32) return fn(tt, float{});
    if (g != t) no_cpu_kernel(op, g);
    fn(tt, tt);
  });
}

// Library scratch is the op's last workspace tensor, typed uint8 (backend.hpp).
inline void* scratch_of(const Program& p, const Op& op, const OpBinding& binding) {
  if (!op.workspace.empty() && p.tensor(op.workspace.back()).dtype == DType::u8) return binding.workspace.back();
  return nullptr;
}

inline const float* in_f(const OpBinding& b, size_t i) { return static_cast<const float*>(b.inputs[i]); }
inline const int32_t* in_i(const OpBinding& b, size_t i) { return static_cast<const int32_t*>(b.inputs[i]); }
inline float* out_f(const OpBinding& b, size_t j) { return static_cast<float*>(b.outputs[j]); }
template <class T>
const T* in_t(const OpBinding& b, size_t i) {
  return static_cast<const T*>(b.inputs[i]);
}
template <class T>
T* out_t(const OpBinding& b, size_t j) {
  return static_cast<T*>(b.outputs[j]);
}

using Prepared = std::unique_ptr<PreparedOp>;

// prepare_dense.cpp
Prepared prepare_embedding(const Program& p, const Op& op, const OpBinding& b);
Prepared prepare_matmul(const DnnlEnv& env, const Program& p, const Op& op, const OpBinding& b);
Prepared prepare_bias_grad(const Program& p, const Op& op, const OpBinding& b);
Prepared prepare_pointwise(const Program& p, const Op& op, const OpBinding& b);  // gelu, swiglu, add, accumulate, cast
Prepared prepare_fill(const Program& p, const Op& op, const OpBinding& b);
uint64_t matmul_scratch_bytes(const DnnlEnv& env, const Program& p, const Op& op);
// prepare_quant.cpp
Prepared prepare_quant_linear(const DnnlEnv& env, const Program& p, const Op& op, const OpBinding& b);
uint64_t quant_linear_scratch_bytes(const DnnlEnv& env, const Program& p, const Op& op);
// prepare_dora.cpp
Prepared prepare_dora(const Program& p, const Op& op, const OpBinding& b);  // dora_norm, dora_scale(_backward)
// prepare_norm.cpp
Prepared prepare_norm(const Program& p, const Op& op, const OpBinding& b);  // layernorm, rmsnorm
// prepare_attention.cpp
Prepared prepare_rope(const Program& p, const Op& op, const OpBinding& b);
Prepared prepare_attention(const DnnlEnv& env, const Program& p, const Op& op, const OpBinding& b);  // plain
Prepared prepare_flash_attention(const Program& p, const Op& op, const OpBinding& b);
uint64_t attention_scratch_bytes(const DnnlEnv& env, const Program& p, const Op& op);  // plain and flash
// prepare_generation.cpp
Prepared prepare_cached_attention(const Program& p, const Op& op, const OpBinding& b);
Prepared prepare_embedding_at(const Program& p, const Op& op, const OpBinding& b);
uint64_t cached_attention_scratch_bytes(const Op& op);
// prepare_classifier.cpp
Prepared prepare_classifier(const DnnlEnv& env, const Program& p, const Op& op, const OpBinding& b);
Prepared prepare_loss_mean(const Program& p, const Op& op, const OpBinding& b);
uint64_t classifier_scratch_bytes(const DnnlEnv& env, const Program& p, const Op& op);
// prepare_optimizer.cpp
Prepared prepare_adamw(const Program& p, const Op& op, const OpBinding& b);
Prepared prepare_adamw8bit(const Program& p, const Op& op, const OpBinding& b);
Prepared prepare_grad_norm(const Program& p, const Op& op, const OpBinding& b);
Prepared prepare_check_finite(const Program& p, const Op& op, const OpBinding& b);

}  // namespace memfit::cpu
