// Reference kernels of the tensor-parallel kinds (see reference.hpp): add_bias and the
// vocabulary-parallel classifier. One row at a time in double, the logits of a row in a
// std::vector (the reference may allocate; it is never on a step's path).
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/error.hpp"
#include "kernels/reference/reference.hpp"

namespace memfit::ref {
namespace {

template <class F>
void store(F* dst, double value, bool acc) {
  *dst = acc ? F(double(*dst) + value) : F(value);
}

// The logits of row n over the slice's Vs columns.
template <class F>
void slice_logits(const F* x, const F* w, int64_t n, int64_t C, int64_t Vs, std::vector<double>& logits) {
  for (int64_t j = 0; j < Vs; ++j) {
    double s = 0;
    for (int64_t c = 0; c < C; ++c) s += double(x[n * C + c]) * double(w[j * C + c]);
    logits[size_t(j)] = s;
  }
}

// The slice's real columns: global column vocab_begin + j < V.
int64_t real_columns(int64_t V, int64_t Vs, int64_t vocab_begin) { return std::clamp<int64_t>(V - vocab_begin, 0, Vs); }

}  // namespace

template <class F>
void add_bias(const F* x, const F* bias, F* y, int64_t rows, int64_t cols, bool acc) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) store(&y[r * cols + c], double(x[r * cols + c]) + double(bias[c]), acc);
}

template <class F>
void classifier_partial(const F* x, const F* w, const int32_t* targets, F* stats, int64_t N, int64_t C, int64_t V,
                        int64_t Vs, int64_t vocab_begin) {
  const int64_t real = real_columns(V, Vs, vocab_begin);
  std::vector<double> logits(static_cast<size_t>(Vs));
  for (int64_t n = 0; n < N; ++n) {
    const int64_t target = targets[n];
    MEMFIT_ASSERT(target >= 0 && target < V, "target {} outside [0, {})", target, V);
    slice_logits(x, w, n, C, Vs, logits);
    double mx = -std::numeric_limits<double>::infinity(), sum = 0;
    for (int64_t j = 0; j < real; ++j) mx = std::max(mx, logits[size_t(j)]);
    for (int64_t j = 0; j < real; ++j) sum += std::exp(logits[size_t(j)] - mx);
    const int64_t local = target - vocab_begin;
    stats[n * 3 + 0] = F(mx);
    stats[n * 3 + 1] = F(sum);
    stats[n * 3 + 2] = F(local >= 0 && local < real ? logits[size_t(local)] : 0.0);
  }
}

template <class F>
void classifier_combine(const F* stats, F* losses, F* lse, int64_t P, int64_t N) {
  for (int64_t n = 0; n < N; ++n) {
    double mx = -std::numeric_limits<double>::infinity(), target = 0;
    for (int64_t r = 0; r < P; ++r) {
      const F* s = stats + (r * N + n) * 3;
      if (double(s[1]) > 0) mx = std::max(mx, double(s[0]));
      target += double(s[2]);
    }
    double sum = 0;
    for (int64_t r = 0; r < P; ++r) {
      const F* s = stats + (r * N + n) * 3;
      if (double(s[1]) > 0) sum += double(s[1]) * std::exp(double(s[0]) - mx);
    }
    const double l = mx + std::log(sum);
    if (lse) lse[n] = F(l);
    if (losses) losses[n] = F(l - target);
  }
}

template <class F>
void classifier_parallel_backward(const F* x, const F* w, const int32_t* targets, const F* lse, F* dx, F* dw,
                                  int64_t N, int64_t C, int64_t V, int64_t Vs, int64_t vocab_begin, double dscale,
                                  bool acc_dx, bool acc_dw) {
  const int64_t real = real_columns(V, Vs, vocab_begin);
  std::vector<double> g(static_cast<size_t>(Vs)), gw;
  if (dw) gw.assign(size_t(Vs * C), 0.0);
  for (int64_t n = 0; n < N; ++n) {
    const int64_t target = targets[n];
    MEMFIT_ASSERT(target >= 0 && target < V, "target {} outside [0, {})", target, V);
    slice_logits(x, w, n, C, Vs, g);
    for (int64_t j = 0; j < Vs; ++j)
      g[size_t(j)] = j < real ? (std::exp(g[size_t(j)] - double(lse[n])) - (vocab_begin + j == target ? 1.0 : 0.0)) * dscale
                              : 0.0;
    if (dx)
      for (int64_t c = 0; c < C; ++c) {
        double s = 0;
        for (int64_t j = 0; j < Vs; ++j) s += g[size_t(j)] * double(w[j * C + c]);
        store(&dx[n * C + c], s, acc_dx);
      }
    if (dw)
      for (int64_t j = 0; j < Vs; ++j)
        for (int64_t c = 0; c < C; ++c) gw[size_t(j * C + c)] += g[size_t(j)] * double(x[n * C + c]);
  }
  if (dw)
    for (int64_t i = 0; i < Vs * C; ++i) store(&dw[i], gw[size_t(i)], acc_dw);
}

#define MEMFIT_REF_INSTANTIATE(F)                                                                                   \
  template void add_bias<F>(const F*, const F*, F*, int64_t, int64_t, bool);                                        \
  template void classifier_partial<F>(const F*, const F*, const int32_t*, F*, int64_t, int64_t, int64_t, int64_t,   \
                                      int64_t);                                                                     \
  template void classifier_combine<F>(const F*, F*, F*, int64_t, int64_t);                                          \
  template void classifier_parallel_backward<F>(const F*, const F*, const int32_t*, const F*, F*, F*, int64_t,      \
                                                int64_t, int64_t, int64_t, int64_t, double, bool, bool);
MEMFIT_REF_INSTANTIATE(float)
MEMFIT_REF_INSTANTIATE(double)
#undef MEMFIT_REF_INSTANTIATE

}  // namespace memfit::ref
