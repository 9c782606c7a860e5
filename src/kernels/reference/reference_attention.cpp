// Reference causal attention and fused classifier (see reference.hpp). Both work one row at
// a time with the row held in a std::vector<double>: the reference may allocate, it is never
// on a step's path.
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

// Column offsets in a row of qkv: query head h, key and value head j (of KV; 0 means NH).
struct Cols {
  int64_t NH, KV, HS, W;
  Cols(int64_t nh, int64_t kv, int64_t hs) : NH(nh), KV(kv > 0 ? kv : nh), HS(hs), W((NH + 2 * KV) * HS) {}
  int64_t q(int64_t h) const { return h * HS; }
  int64_t kv_of(int64_t h) const { return h / (NH / KV); }
  int64_t k(int64_t h) const { return (NH + kv_of(h)) * HS; }       // of query head h's kv head
  int64_t v(int64_t h) const { return (NH + KV + kv_of(h)) * HS; }  // likewise
};

}  // namespace

template <class F>
void attention_forward(const F* qkv, F* y, F* probs, int64_t B, int64_t T, int64_t NH, int64_t HS, double scale,
                       bool acc_y, int64_t KV) {
  const int64_t C = NH * HS;
  const Cols col(NH, KV, HS);
  const int64_t W = col.W;
  std::vector<double> p(size_t(T), 0.0);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < NH; ++h)
      for (int64_t t = 0; t < T; ++t) {
        const F* q = qkv + (b * T + t) * W + col.q(h);
        double mx = -std::numeric_limits<double>::infinity();
        for (int64_t s = 0; s <= t; ++s) {
          const F* k = qkv + (b * T + s) * W + col.k(h);
          double dot = 0;
          for (int64_t d = 0; d < HS; ++d) dot += double(q[d]) * double(k[d]);
          p[size_t(s)] = scale * dot;
          mx = std::max(mx, p[size_t(s)]);
        }
        double sum = 0;
        for (int64_t s = 0; s <= t; ++s) {
          p[size_t(s)] = std::exp(p[size_t(s)] - mx);
          sum += p[size_t(s)];
        }
        F* prow = probs + ((b * NH + h) * T + t) * T;
        for (int64_t s = 0; s < T; ++s) prow[s] = s <= t ? F(p[size_t(s)] / sum) : F(0);
        for (int64_t d = 0; y && d < HS; ++d) {
          double acc = 0;
          for (int64_t s = 0; s <= t; ++s) acc += p[size_t(s)] / sum * double(qkv[(b * T + s) * W + col.v(h) + d]);
          store(&y[(b * T + t) * C + h * HS + d], acc, acc_y);
        }
      }
}

template <class F>
void attention_backward(const F* dy, const F* qkv, const F* probs, F* dqkv, int64_t B, int64_t T, int64_t NH,
                        int64_t HS, double scale, bool acc, int64_t KV) {
  const int64_t C = NH * HS;
  const Cols col(NH, KV, HS);
  const int64_t W = col.W;
  // Gradients are summed in double over the whole tensor, then stored once, so that
  // accumulate mode adds each element exactly one value (and a kv head's gradient is the sum
  // over its query heads before it is rounded).
  std::vector<double> g(size_t(B * T * W), 0.0);
  std::vector<double> dp(size_t(T), 0.0);
  // Element d of query head h's q (part 0), k (1) or v (2) at position t of batch b.
  auto at = [&](int64_t b, int64_t t, int64_t part, int64_t h, int64_t d) {
    return (b * T + t) * W + (part == 0 ? col.q(h) : part == 1 ? col.k(h) : col.v(h)) + d;
  };
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < NH; ++h)
      for (int64_t t = 0; t < T; ++t) {
        const F* prow = probs + ((b * NH + h) * T + t) * T;
        const F* dyr = dy + (b * T + t) * C + h * HS;
        // y_t = sum_s p_ts v_s: dv_s += p_ts dy_t and dp_ts = dy_t . v_s.
        double dot = 0;
        for (int64_t s = 0; s <= t; ++s) {
          double d_ps = 0;
          for (int64_t d = 0; d < HS; ++d) {
            g[size_t(at(b, s, 2, h, d))] += double(prow[s]) * double(dyr[d]);
            d_ps += double(dyr[d]) * double(qkv[at(b, s, 2, h, d)]);
          }
          dp[size_t(s)] = d_ps;
          dot += double(prow[s]) * d_ps;
        }
        // softmax backward, then the score s_ts = scale * q_t . k_s.
        for (int64_t s = 0; s <= t; ++s) {
          const double ds = double(prow[s]) * (dp[size_t(s)] - dot) * scale;
          for (int64_t d = 0; d < HS; ++d) {
            g[size_t(at(b, t, 0, h, d))] += ds * double(qkv[at(b, s, 1, h, d)]);
            g[size_t(at(b, s, 1, h, d))] += ds * double(qkv[at(b, t, 0, h, d)]);
          }
        }
      }
  for (size_t i = 0; i < g.size(); ++i) store(&dqkv[i], g[i], acc);
}

template <class F>
void classifier(const F* x, const F* wte, const int32_t* targets, F* losses, F* dx, F* dwte, int64_t N, int64_t C,
                int64_t V, int64_t Vp, double dscale, bool acc_dx, bool acc_dwte) {
  std::vector<double> logits(static_cast<size_t>(Vp)), gwte;
  if (dwte) gwte.assign(size_t(Vp * C), 0.0);
  for (int64_t n = 0; n < N; ++n) {
    const int64_t target = targets[n];
    MEMFIT_ASSERT(target >= 0 && target < V, "target {} outside [0, {})", target, V);
    const F* xr = x + n * C;
    double mx = -std::numeric_limits<double>::infinity();
    for (int64_t j = 0; j < Vp; ++j) {
      double s = 0;
      for (int64_t c = 0; c < C; ++c) s += double(xr[c]) * double(wte[j * C + c]);
      logits[size_t(j)] = s;
      if (j < V) mx = std::max(mx, s);
    }
    double sum = 0;
    for (int64_t j = 0; j < V; ++j) sum += std::exp(logits[size_t(j)] - mx);
    const double lse = mx + std::log(sum);
    if (losses) losses[n] = F(lse - logits[size_t(target)]);
    // dlogits in place of the logits; padding columns get exactly no gradient.
    for (int64_t j = 0; j < Vp; ++j)
      logits[size_t(j)] = j < V ? (std::exp(logits[size_t(j)] - lse) - (j == target ? 1.0 : 0.0)) * dscale : 0.0;
    if (dx)
      for (int64_t c = 0; c < C; ++c) {
        double s = 0;
        for (int64_t j = 0; j < Vp; ++j) s += logits[size_t(j)] * double(wte[j * C + c]);
        store(&dx[n * C + c], s, acc_dx);
      }
    if (dwte)
      for (int64_t j = 0; j < Vp; ++j)
        for (int64_t c = 0; c < C; ++c) gwte[size_t(j * C + c)] += logits[size_t(j)] * double(xr[c]);
  }
  if (dwte)
    for (int64_t i = 0; i < Vp * C; ++i) store(&dwte[i], gwte[size_t(i)], acc_dwte);
}

#define MEMFIT_REF_INSTANTIATE(F)                                                                                  \
  template void attention_forward<F>(const F*, F*, F*, int64_t, int64_t, int64_t, int64_t, double, bool, int64_t); \
  template void attention_backward<F>(const F*, const F*, const F*, F*, int64_t, int64_t, int64_t, int64_t, double, \
                                      bool, int64_t);                                                              \
  template void classifier<F>(const F*, const F*, const int32_t*, F*, F*, F*, int64_t, int64_t, int64_t, int64_t,  \
                              double, bool, bool);

MEMFIT_REF_INSTANTIATE(float)
MEMFIT_REF_INSTANTIATE(double)
#undef MEMFIT_REF_INSTANTIATE

}  // namespace memfit::ref
