// Reference optimizer kernels (see reference_optimizer.hpp): written to be read, not fast.
#include "kernels/reference/reference_optimizer.hpp"

#include <algorithm>
#include <cmath>

namespace memfit::ref {

uint8_t quantize_nearest(const QuantMap& map, double y) {
  int best = 0;
  for (int c = 1; c < kQuantMapSize; ++c)
    if (std::fabs(y - double(map[size_t(c)])) < std::fabs(y - double(map[size_t(best)]))) best = c;
  return uint8_t(best);
}

void quantize_blockwise(const QuantMap& map, const float* x, uint8_t* codes, float* absmax, int64_t n, int64_t block) {
  for (int64_t b = 0; b * block < n; ++b) {
    const int64_t begin = b * block, end = std::min(n, begin + block);
    double amax = 0;
    for (int64_t i = begin; i < end; ++i) amax = std::max(amax, std::fabs(double(x[i])));
    absmax[b] = float(amax);
    for (int64_t i = begin; i < end; ++i) codes[i] = quantize_nearest(map, amax > 0 ? double(x[i]) / amax : 0.0);
  }
}

void dequantize_blockwise(const QuantMap& map, const uint8_t* codes, const float* absmax, float* x, int64_t n,
                          int64_t block) {
  for (int64_t i = 0; i < n; ++i) x[i] = float(double(map[codes[i]]) * double(absmax[i / block]));
}

void adamw8bit(float* param, const float* grad, uint8_t* m_codes, uint8_t* v_codes, float* m_absmax, float* v_absmax,
               int64_t n, int64_t block, double lr, double beta1, double beta2, double eps, double weight_decay,
               int64_t step, double grad_scale) {
  const QuantMap& mmap = dynamic_map_signed();
  const QuantMap& vmap = dynamic_map_unsigned();
  const double bc1 = 1.0 - std::pow(beta1, double(step));
  const double bc2 = 1.0 - std::pow(beta2, double(step));
  std::vector<double> m(static_cast<size_t>(block)), v(static_cast<size_t>(block));
  for (int64_t b = 0; b * block < n; ++b) {
    const int64_t begin = b * block, end = std::min(n, begin + block);
    double m_amax = 0, v_amax = 0;
    for (int64_t i = begin; i < end; ++i) {
      const double g = double(grad[i]) * grad_scale;
      double& mi = m[size_t(i - begin)];
      double& vi = v[size_t(i - begin)];
      mi = beta1 * double(mmap[m_codes[i]]) * double(m_absmax[b]) + (1.0 - beta1) * g;
      vi = beta2 * double(vmap[v_codes[i]]) * double(v_absmax[b]) + (1.0 - beta2) * g * g;
      m_amax = std::max(m_amax, std::fabs(mi));
      v_amax = std::max(v_amax, vi);
      const double p = double(param[i]) * (1.0 - lr * weight_decay);
      param[i] = float(p - (lr / bc1) * mi / (std::sqrt(vi) / std::sqrt(bc2) + eps));
    }
    // The codes divide by the absmax as stored (fp32), as a reader dequantizing them will.
    m_absmax[b] = float(m_amax);
    v_absmax[b] = float(v_amax);
    for (int64_t i = begin; i < end; ++i) {
      const double ma = double(m_absmax[b]), va = double(v_absmax[b]);
      m_codes[i] = quantize_nearest(mmap, ma > 0 ? m[size_t(i - begin)] / ma : 0.0);
      v_codes[i] = quantize_nearest(vmap, va > 0 ? v[size_t(i - begin)] / va : 0.0);
    }
  }
}

double global_norm(const std::vector<const float*>& tensors, const std::vector<int64_t>& numel) {
  double sum = 0;
  for (size_t t = 0; t < tensors.size(); ++t)
    for (int64_t i = 0; i < numel[t]; ++i) sum += double(tensors[t][i]) * double(tensors[t][i]);
  return std::sqrt(sum);
}

}  // namespace memfit::ref
