// AdamW, PyTorch's formula: p *= 1 - lr wd; m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2;
// p -= (lr / (1 - b1^t)) m / (sqrt(v) / sqrt(1 - b2^t) + eps). The one subtle point is load
// balance: a GPT-2 has a few huge matrices and many tiny bias and norm vectors, so the pass
// runs over the concatenation of all tensors and each thread takes one contiguous slice of
// that flattened range, whatever tensors it crosses.
#include "kernels/cpu/adamw.hpp"

#include <algorithm>
#include <cmath>

#include "kernels/cpu/parallel.hpp"

namespace memfit {

AdamWSet::AdamWSet(std::vector<AdamWTensor> tensors) : tensors_(std::move(tensors)) {
  offsets_.assign(tensors_.size() + 1, 0);
  for (size_t i = 0; i < tensors_.size(); ++i) offsets_[i + 1] = offsets_[i] + tensors_[i].numel;
}

void AdamWSet::run(const AdamWHyper& h) const {
  const double bc1 = 1.0 - std::pow(double(h.beta1), double(h.step));
  const double bc2 = 1.0 - std::pow(double(h.beta2), double(h.step));
  const float step_size = float(double(h.lr) / bc1);
  const float inv_sqrt_bc2 = float(1.0 / std::sqrt(bc2));
  const float b1 = h.beta1, b2 = h.beta2, eps = h.eps;
  const float one_b1 = 1.0f - b1, one_b2 = 1.0f - b2;
  const int64_t total = offsets_.back();
  const AdamWTensor* tensors = tensors_.data();
  const int64_t* offsets = offsets_.data();
  const int64_t count = int64_t(tensors_.size());
  parallel_for(total, kParallelGrain, [=](int64_t lo, int64_t hi) {
    int64_t i = std::upper_bound(offsets, offsets + count + 1, lo) - offsets - 1;
    for (int64_t pos = lo; pos < hi && i < count; ++i) {
      const AdamWTensor& t = tensors[i];
      const int64_t begin = pos - offsets[i], end = std::min(hi, offsets[i + 1]) - offsets[i];
      const float decay = float(1.0 - double(h.lr) * double(t.weight_decay));
      float* p = t.param;
      const float* g = t.grad;
      float* m = t.m;
      float* v = t.v;
#pragma omp simd
      for (int64_t e = begin; e < end; ++e) {
        const float ge = g[e];
        const float me = b1 * m[e] + one_b1 * ge;
        const float ve = b2 * v[e] + one_b2 * ge * ge;
        m[e] = me;
        v[e] = ve;
        p[e] = p[e] * decay - step_size * me / (std::sqrt(ve) * inv_sqrt_bc2 + eps);
      }
      pos = offsets[i] + end;
    }
  });
}

}  // namespace memfit
