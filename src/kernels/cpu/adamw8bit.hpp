// 8-bit blockwise AdamW (Dettmers et al.) over many parameter tensors in one fused pass.
// Each tensor's moments are 8-bit codes in blocks of `block` elements with one fp32 absmax per
// block: m in the signed dynamic map, v in the unsigned one (kernels/quant_map.hpp).
#pragma once

#include <cstdint>
#include <vector>

#include "core/dtype.hpp"
#include "kernels/cpu/adamw.hpp"

namespace memfit {

struct AdamW8bitTensor {
  float* param = nullptr;      // the tensor updated: the parameter, or its fp32 master copy
  const void* grad = nullptr;  // element type: the set's grad dtype
  uint8_t* m = nullptr;        // numel codes
  uint8_t* v = nullptr;
  float* m_absmax = nullptr;   // ceil(numel / block) scales
  float* v_absmax = nullptr;
  int64_t numel = 0;
  float weight_decay = 0;
};

class AdamW8bitSet {
 public:
  // grad_dtype: the gradients' element type (fp32 only for now; 16-bit gradients are one
  // more instantiation of the update, see adamw8bit.cpp).
  AdamW8bitSet(std::vector<AdamW8bitTensor> tensors, int64_t block, DType grad_dtype);
  // One step on every tensor; every gradient is multiplied by h.grad_scale first (the
  // clipping coefficient over the loss scale).
  void run(const AdamWHyper& h) const;
  int64_t blocks() const { return block_offsets_.back(); }

 private:
  std::vector<AdamW8bitTensor> tensors_;
  std::vector<int64_t> block_offsets_;  // blocks before tensor i; size n + 1
  int64_t block_;
  DType grad_dtype_;
};

}  // namespace memfit
