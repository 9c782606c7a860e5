// AdamW over many parameter tensors in one fused pass.
#pragma once

#include <cstdint>
#include <vector>

namespace memfit {

struct AdamWTensor {
  float* param = nullptr;
  const float* grad = nullptr;
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
