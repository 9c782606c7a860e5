// Global gradient norm. Bandwidth bound (one read of every gradient); squares are summed in
// double, eight lanes at a time, so the norm of a 124M-parameter model is exact to fp32.
#include "kernels/cpu/grad_norm.hpp"

#include <algorithm>
#include <cmath>

#include "core/error.hpp"
#include "core/half.hpp"
#include "kernels/cpu/parallel.hpp"

namespace memfit {
namespace {

template <class G>
double sum_of_squares(const G* g, int64_t begin, int64_t end) {
  double s = 0;
#pragma omp simd reduction(+ : s)
  for (int64_t i = begin; i < end; ++i) {
    const double x = double(widen(g[i]));
    s += x * x;
  }
  return s;
}

}  // namespace

GradNormSet::GradNormSet(std::vector<GradNormTensor> tensors, int64_t chunk, DType grad_dtype)
    : tensors_(std::move(tensors)), chunk_(chunk), grad_dtype_(grad_dtype) {
  MEMFIT_CHECK(chunk >= 1, "kernels", "grad_norm: chunk of {} elements", chunk);
  MEMFIT_CHECK(grad_dtype == DType::f32 || grad_dtype == DType::bf16 || grad_dtype == DType::f16, "kernels",
               "grad_norm: no CPU kernel for {} gradients", dtype_name(grad_dtype));
  offsets_.assign(tensors_.size() + 1, 0);
  for (size_t i = 0; i < tensors_.size(); ++i) offsets_[i + 1] = offsets_[i] + tensors_[i].numel;
}

float GradNormSet::run(float* partials, float inv_loss_scale) const {
  return float(std::sqrt(sum_squares(partials)) * double(inv_loss_scale));
}

float GradNormSet::run_sum_of_squares(float* partials, float inv_loss_scale) const {
  const double s = double(inv_loss_scale);
  return float(sum_squares(partials) * s * s);
}

double GradNormSet::sum_squares(float* partials) const {
  const GradNormTensor* tensors = tensors_.data();
  const int64_t* offsets = offsets_.data();
  const int64_t count = int64_t(tensors_.size()), chunk = chunk_, total = offsets_.back();
  const DType dtype = grad_dtype_;
  parallel_for(chunks(), std::max<int64_t>(1, kParallelGrain / chunk), [=](int64_t lo, int64_t hi) {
    for (int64_t c = lo; c < hi; ++c) {
      const int64_t first = c * chunk, last = std::min(total, first + chunk);
      int64_t i = std::upper_bound(offsets, offsets + count + 1, first) - offsets - 1;
      double s = 0;
      for (int64_t pos = first; pos < last; ++i) {
        const int64_t end = std::min(last, offsets[i + 1]);
        const int64_t b = pos - offsets[i], e = end - offsets[i];
        const void* g = tensors[i].grad;
        if (dtype == DType::bf16) s += sum_of_squares(static_cast<const bf16_t*>(g), b, e);
        else if (dtype == DType::f16) s += sum_of_squares(static_cast<const fp16_t*>(g), b, e);
        else s += sum_of_squares(static_cast<const float*>(g), b, e);
        pos = end;
      }
      partials[c] = float(s);
    }
  });
  double sum = 0;
  for (int64_t c = 0; c < chunks(); ++c) sum += double(partials[c]);
  return sum;
}

float clip_coefficient(float norm, double max_norm) {
  if (max_norm <= 0) return 1.0f;
  const float coef = float(max_norm) / (norm + 1e-6f);
  return std::min(coef, 1.0f);
}

}  // namespace memfit
