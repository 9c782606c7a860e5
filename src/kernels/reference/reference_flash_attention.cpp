// Reference flash attention (see reference.hpp): the plain formulas of the memory-efficient
// form, one query row at a time in double, with no tiling and no online softmax, so that the
// CPU kernel's tiling, masking and running maxima are checked against something that has none.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/reference/reference.hpp"

namespace memfit::ref {
namespace {

// Column offsets in a row of qkv (W wide): query head h, and the key and value heads that
// query head h reads (kv head h / (NH / KV); KV = 0 means NH).
struct Cols {
  int64_t NH, KV, HS, W;
  Cols(int64_t nh, int64_t kv, int64_t hs) : NH(nh), KV(kv > 0 ? kv : nh), HS(hs), W((NH + 2 * KV) * HS) {}
  int64_t q(int64_t h) const { return h * HS; }
  int64_t k(int64_t h) const { return (NH + h / (NH / KV)) * HS; }
  int64_t v(int64_t h) const { return (NH + KV + h / (NH / KV)) * HS; }
};

// Scaled scores of query t of head (b, h) against keys 0..t.
template <class F>
void scores(const F* qkv, int64_t b, int64_t h, int64_t t, int64_t T, const Cols& col, double scale,
            std::vector<double>& s) {
  const F* q = qkv + (b * T + t) * col.W + col.q(h);
  for (int64_t j = 0; j <= t; ++j) {
    const F* k = qkv + (b * T + j) * col.W + col.k(h);
    double dot = 0;
    for (int64_t d = 0; d < col.HS; ++d) dot += double(q[d]) * double(k[d]);
    s[size_t(j)] = scale * dot;
  }
}

}  // namespace

template <class F>
void flash_attention_forward(const F* qkv, F* y, F* lse, int64_t B, int64_t T, int64_t NH, int64_t HS, double scale,
                             int64_t KV) {
  const int64_t C = NH * HS;
  const Cols col(NH, KV, HS);
  std::vector<double> s(static_cast<size_t>(T));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < NH; ++h)
      for (int64_t t = 0; t < T; ++t) {
        scores(qkv, b, h, t, T, col, scale, s);
        double mx = -std::numeric_limits<double>::infinity(), sum = 0;
        for (int64_t j = 0; j <= t; ++j) mx = std::max(mx, s[size_t(j)]);
        for (int64_t j = 0; j <= t; ++j) sum += std::exp(s[size_t(j)] - mx);
        const double row_lse = mx + std::log(sum);
        lse[(b * NH + h) * T + t] = F(row_lse);
        for (int64_t d = 0; d < HS; ++d) {
          double acc = 0;
          for (int64_t j = 0; j <= t; ++j)
            acc += std::exp(s[size_t(j)] - row_lse) * double(qkv[(b * T + j) * col.W + col.v(h) + d]);
          y[(b * T + t) * C + h * HS + d] = F(acc);
        }
      }
}

template <class F>
void flash_attention_backward(const F* dy, const F* qkv, const F* y, const F* lse, F* dqkv, int64_t B, int64_t T,
                              int64_t NH, int64_t HS, double scale, bool acc, int64_t KV) {
  const int64_t C = NH * HS;
  const Cols col(NH, KV, HS);
  // Summed in double over the whole tensor (a kv head's gradient over all its query heads),
  // then stored once.
  std::vector<double> g(static_cast<size_t>(B * T * col.W), 0.0), s(static_cast<size_t>(T));
  // Element d of query head h's q (part 0), k (1) or v (2) at position t of batch b.
  auto at = [&](int64_t b, int64_t t, int64_t part, int64_t h, int64_t d) {
    return size_t((b * T + t) * col.W + (part == 0 ? col.q(h) : part == 1 ? col.k(h) : col.v(h)) + d);
  };
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < NH; ++h)
      for (int64_t t = 0; t < T; ++t) {
        const F* dyr = dy + (b * T + t) * C + h * HS;
        const F* yr = y + (b * T + t) * C + h * HS;
        double D = 0;
        for (int64_t d = 0; d < HS; ++d) D += double(dyr[d]) * double(yr[d]);
        scores(qkv, b, h, t, T, col, scale, s);
        const double row_lse = double(lse[(b * NH + h) * T + t]);
        for (int64_t j = 0; j <= t; ++j) {
          const double p = std::exp(s[size_t(j)] - row_lse);
          double dp = 0;
          for (int64_t d = 0; d < HS; ++d) {
            g[at(b, j, 2, h, d)] += p * double(dyr[d]);
            dp += double(dyr[d]) * double(qkv[at(b, j, 2, h, d)]);
          }
          const double ds = p * (dp - D) * scale;
          for (int64_t d = 0; d < HS; ++d) {
            g[at(b, t, 0, h, d)] += ds * double(qkv[at(b, j, 1, h, d)]);
            g[at(b, j, 1, h, d)] += ds * double(qkv[at(b, t, 0, h, d)]);
          }
        }
      }
  for (size_t i = 0; i < g.size(); ++i) dqkv[i] = acc ? F(double(dqkv[i]) + g[i]) : F(g[i]);
}

#define MEMFIT_REF_INSTANTIATE(F)                                                                                 \
  template void flash_attention_forward<F>(const F*, F*, F*, int64_t, int64_t, int64_t, int64_t, double, int64_t); \
  template void flash_attention_backward<F>(const F*, const F*, const F*, const F*, F*, int64_t, int64_t, int64_t, \
                                            int64_t, double, bool, int64_t);

MEMFIT_REF_INSTANTIATE(float)
MEMFIT_REF_INSTANTIATE(double)
#undef MEMFIT_REF_INSTANTIATE

}  // namespace memfit::ref
