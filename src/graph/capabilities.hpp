// What a backend computes natively: for each op kind, the dtypes its kernels take. The
// precision pass (graph/precision.hpp) asks it which ops of a 16-bit program need an fp32
// island, so the program a backend runs is made for that backend. Backends answer with their
// own table (Backend::capabilities(), kernels/backend.hpp); a device that is only planned
// (a GPU preset of `memfit plan`) carries a table of what its libraries offer (fit/hardware.hpp).
//
// Invariant: a table is never guessed. A default-constructed table is empty (known() is
// false), and the precision pass refuses an empty one rather than assume some backend.
// "Native" means the kernel takes tensors stored in that dtype; its arithmetic may be fp32
// inside (the CPU's 16-bit norms widen per element), which is not an island.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <initializer_list>
#include <iterator>
#include <string>

#include "core/dtype.hpp"
#include "graph/op.hpp"

namespace memfit {

inline constexpr size_t kNumOpKinds = size_t(OpKind::classifier_parallel_backward) + 1;

class OpCapabilities {
 public:
  OpCapabilities() = default;  // empty: known() is false
  explicit OpCapabilities(std::string name) : name_(std::move(name)), known_(true) {}

  // Declares that `kind` has a kernel for each of `dtypes`.
  OpCapabilities& allow(OpKind kind, std::initializer_list<DType> dtypes) {
    for (DType t : dtypes) bits_[size_t(kind)] |= uint32_t(1) << unsigned(t);
    return *this;
  }
  OpCapabilities& allow(std::initializer_list<OpKind> kinds, std::initializer_list<DType> dtypes) {
    for (OpKind k : kinds) allow(k, dtypes);
    return *this;
  }
  bool supports(OpKind kind, DType dtype) const { return (bits_[size_t(kind)] >> unsigned(dtype)) & 1u; }
  bool known() const { return known_; }
  const std::string& name() const { return name_; }  // who answers: "cpu", "reference", "h100-80gb"

 private:
  std::string name_;
  bool known_ = false;
  std::array<uint32_t, kNumOpKinds> bits_{};
};

// The kinds every backend computes (the step program's compute ops), for tables to build on.
inline constexpr OpKind kComputeOpKinds[] = {
    OpKind::embedding_forward, OpKind::embedding_backward, OpKind::layernorm_forward, OpKind::layernorm_backward,
    OpKind::rmsnorm_forward,   OpKind::rmsnorm_backward,   OpKind::matmul,            OpKind::bias_grad,
    OpKind::gelu_forward,      OpKind::gelu_backward,      OpKind::swiglu_forward,    OpKind::swiglu_backward,
    OpKind::rope_forward,      OpKind::rope_backward,      OpKind::attention_forward, OpKind::attention_backward,
    OpKind::flash_attention_forward, OpKind::flash_attention_backward, OpKind::add,   OpKind::accumulate,
    OpKind::classifier,        OpKind::classifier_eval,    OpKind::loss_mean,         OpKind::cast,
    OpKind::check_finite,      OpKind::fill,               OpKind::grad_norm,         OpKind::adamw,
    OpKind::adamw8bit,         OpKind::add_columns,        OpKind::slice_columns,     OpKind::dropout_forward,
    OpKind::dropout_backward,  OpKind::quant_linear,       OpKind::quant_linear_backward, OpKind::add_bias,
    OpKind::classifier_partial, OpKind::classifier_combine, OpKind::classifier_parallel_backward,
    OpKind::dora_norm,         OpKind::dora_scale,         OpKind::dora_scale_backward,
    OpKind::dora_blend,        OpKind::dora_blend_backward};

// A GPU with tensor cores and the usual libraries (cuBLAS(Lt), a flash-attention kernel):
// every compute kind in fp32, bf16 and fp16 (what `memfit plan` assumes for A100/H100/H200/
// RTX 4090/L4; an fp16 product there is native, not an fp32 island).
inline OpCapabilities tensor_core_gpu_capabilities(std::string name) {
  OpCapabilities c(std::move(name));
  for (OpKind k : kComputeOpKinds) c.allow(k, {DType::f32, DType::bf16, DType::f16});
  return c;
}

// A tensor-core GPU before Ampere (V100, T4): fp16 products are native, bf16 ones are not
// (cuBLAS's bf16 GEMMs and the flash-attention kernels need sm80), so a bf16 plan there runs its
// products as fp32 islands; the other kinds keep bf16 storage (fp32 arithmetic inside).
inline OpCapabilities pre_ampere_gpu_capabilities(std::string name) {
  OpCapabilities c(std::move(name));
  constexpr OpKind kProducts[] = {OpKind::matmul, OpKind::attention_forward, OpKind::attention_backward,
                                  OpKind::flash_attention_forward, OpKind::flash_attention_backward,
                                  OpKind::classifier, OpKind::classifier_eval, OpKind::classifier_partial,
                                  OpKind::classifier_parallel_backward, OpKind::quant_linear,
                                  OpKind::quant_linear_backward};
  for (OpKind k : kComputeOpKinds) {
    c.allow(k, {DType::f32, DType::f16});
    if (std::find(std::begin(kProducts), std::end(kProducts), k) == std::end(kProducts)) c.allow(k, {DType::bf16});
  }
  return c;
}

}  // namespace memfit
