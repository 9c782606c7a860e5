// AdamW over many parameter tensors in one fused pass. The parameters it updates are fp32
// (the parameters themselves, or their fp32 masters under mixed precision); the gradients
// may be fp32, bf16 or fp16 and arrive multiplied by the loss scale, which the update divides
// out first (StepContext::loss_scale; 1 without loss scaling).
#pragma once

#include <cstdint>
#include <vector>

#include "core/dtype.hpp"

namespace memfit {

struct AdamWTensor {
  float* param = nullptr;
  const void* grad = nullptr;
  DType grad_dtype = DType::f32;
  float* m = nullptr;
  float* v = nullptr;
  int64_t numel = 0;
  float weight_decay = 0;
};

struct AdamWHyper {
  double lr = 0, beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
  int64_t step = 1;  // 1-based
  // Every gradient is multiplied by this before use: the clipping coefficient over the loss
  // scale (1 without either, which leaves the gradient bit for bit unchanged).
  float grad_scale = 1;
};

// The tensors of one adamw op, with the prefix sums that let threads split the flattened
// element range; built at prepare time.
class AdamWSet {
 public:
  explicit AdamWSet(std::vector<AdamWTensor> tensors);
  // PyTorch's AdamW (decoupled weight decay, bias-corrected moments) on every tensor.
  void run(const AdamWHyper& h) const;
  int64_t total() const { return offsets_.back(); }

 private:
  std::vector<AdamWTensor> tensors_;
  std::vector<int64_t> offsets_;  // offsets_[i] = elements before tensor i; size n + 1
};

}  // namespace memfit
