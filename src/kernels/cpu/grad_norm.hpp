// The global gradient norm (gradient clipping) and the clipping coefficient.
#pragma once

#include <cstdint>
#include <vector>

#include "core/dtype.hpp"

namespace memfit {

struct GradNormTensor {
  const void* grad = nullptr;  // element type: the set's grad dtype
  int64_t numel = 0;
};

// sqrt(sum of g^2) over every gradient, in fixed chunks of the flattened element range so
// the result does not depend on the thread count: each chunk's sum of squares (in double)
// goes to partials[chunk], then the partials are added in order.
class GradNormSet {
 public:
  GradNormSet(std::vector<GradNormTensor> tensors, int64_t chunk, DType grad_dtype);
  int64_t chunks() const { return (offsets_.back() + chunk_ - 1) / chunk_; }
  // The norm of the unscaled gradients: sqrt(sum g^2) * inv_loss_scale. partials holds chunks() floats.
  float run(float* partials, float inv_loss_scale) const;
  // sum g^2 * inv_loss_scale^2: the part of a sharded norm one rank adds (GradNormAttrs::Form).
  float run_sum_of_squares(float* partials, float inv_loss_scale) const;

 private:
  double sum_squares(float* partials) const;

  std::vector<GradNormTensor> tensors_;
  std::vector<int64_t> offsets_;  // elements before tensor i; size n + 1
  int64_t chunk_;
  DType grad_dtype_;
};

// PyTorch's clip_grad_norm_ coefficient: max_norm / (norm + 1e-6), at most 1; 1 when
// max_norm is 0 (no clipping).
float clip_coefficient(float norm, double max_norm);

}  // namespace memfit
