// Reference kernels for RMSNorm, SwiGLU and RoPE (see reference_llama.hpp). Everything runs
// in double and is rounded once to F at the store. The one subtle point is RoPE's layout:
// only the first (H + KV) heads of a token row rotate, the KV value heads after them are
// copied, and the position is the row index modulo T.
#include "kernels/reference/reference_llama.hpp"

#include <cmath>

namespace memfit::ref {
namespace {

template <class F>
void store(F* dst, double value, bool acc) {
  *dst = acc ? F(double(*dst) + value) : F(value);
}

double sigmoid(double g) { return 1.0 / (1.0 + std::exp(-g)); }

// Meta's apply_scaling for Llama 3.1, in double: the oracle for the CPU kernel's float32 copy
// of transformers' arithmetic.
double scaled_inv_freq(double inv, const RopeScaling& s) {
  if (s.kind == RopeScaling::Kind::none) return inv;
  if (s.kind == RopeScaling::Kind::linear) return inv / s.factor;
  const double wavelen = 2 * M_PI / inv;
  const double low_wavelen = s.original_max_positions / s.low_freq_factor;
  const double high_wavelen = s.original_max_positions / s.high_freq_factor;
  if (wavelen < high_wavelen) return inv;
  if (wavelen > low_wavelen) return inv / s.factor;
  const double smooth = (s.original_max_positions / wavelen - s.low_freq_factor) /
                        (s.high_freq_factor - s.low_freq_factor);
  return (1 - smooth) * inv / s.factor + smooth * inv;
}

template <class F>
void rope(const F* x, F* y, int64_t B, int64_t T, int64_t heads, int64_t kv_heads, int64_t hs, double theta,
          const RopeScaling& scaling, double sign) {
  const int64_t half = hs / 2, row = (heads + 2 * kv_heads) * hs;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t) {
      const F* xr = x + (b * T + t) * row;
      F* yr = y + (b * T + t) * row;
      for (int64_t h = 0; h < heads + 2 * kv_heads; ++h) {
        const F* xh = xr + h * hs;
        F* yh = yr + h * hs;
        if (h >= heads + kv_heads) {
          for (int64_t c = 0; c < hs; ++c) yh[c] = xh[c];
          continue;
        }
        for (int64_t i = 0; i < half; ++i) {
          const double a = sign * double(t) * scaled_inv_freq(std::pow(theta, -2.0 * double(i) / double(hs)), scaling);
          const double x0 = double(xh[i]), x1 = double(xh[i + half]);
          yh[i] = F(x0 * std::cos(a) - x1 * std::sin(a));
          yh[i + half] = F(x1 * std::cos(a) + x0 * std::sin(a));
        }
      }
    }
}

}  // namespace

template <class F>
void rmsnorm_forward(const F* x, const F* w, F* y, F* rstd, int64_t N, int64_t C, double eps) {
  for (int64_t n = 0; n < N; ++n) {
    const F* xr = x + n * C;
    double ms = 0;
    for (int64_t c = 0; c < C; ++c) ms += double(xr[c]) * double(xr[c]);
    ms /= double(C);
    const double rs = 1.0 / std::sqrt(ms + eps);
    for (int64_t c = 0; c < C; ++c) y[n * C + c] = F(double(xr[c]) * rs * double(w[c]));
    if (rstd) rstd[n] = F(rs);
  }
}

template <class F>
void rmsnorm_backward(const F* dy, const F* x, const F* w, const F* rstd, F* dx, F* dw, int64_t N, int64_t C,
                      bool acc_dx, bool acc_dw) {
  if (dw)
    for (int64_t c = 0; c < C; ++c) {
      double s = 0;
      for (int64_t n = 0; n < N; ++n) s += double(dy[n * C + c]) * double(x[n * C + c]) * double(rstd[n]);
      store(&dw[c], s, acc_dw);
    }
  if (dx)
    for (int64_t n = 0; n < N; ++n) {
      const double rs = double(rstd[n]);
      double sgx = 0;
      for (int64_t c = 0; c < C; ++c) sgx += double(dy[n * C + c]) * double(w[c]) * double(x[n * C + c]) * rs;
      const double mgx = sgx / double(C);
      for (int64_t c = 0; c < C; ++c) {
        const double g = double(dy[n * C + c]) * double(w[c]), xhat = double(x[n * C + c]) * rs;
        store(&dx[n * C + c], rs * (g - xhat * mgx), acc_dx);
      }
    }
}

template <class F>
void swiglu_forward(const F* gate, const F* up, F* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const double g = double(gate[i]);
    y[i] = F(g * sigmoid(g) * double(up[i]));
  }
}

template <class F>
void swiglu_backward(const F* dy, const F* gate, const F* up, F* dgate, F* dup, int64_t n, bool acc_dgate,
                     bool acc_dup) {
  for (int64_t i = 0; i < n; ++i) {
    const double g = double(gate[i]), d = double(dy[i]), s = sigmoid(g);
    const double vg = d * double(up[i]) * (s + g * s * (1.0 - s));
    const double vu = d * g * s;
    if (dgate) store(&dgate[i], vg, acc_dgate);
    if (dup) store(&dup[i], vu, acc_dup);
  }
}

template <class F>
void rope_forward(const F* x, F* y, int64_t B, int64_t T, int64_t heads, int64_t kv_heads, int64_t head_dim,
                  double theta, const RopeScaling& scaling) {
  rope(x, y, B, T, heads, kv_heads, head_dim, theta, scaling, 1.0);
}

template <class F>
void rope_backward(const F* dy, F* dx, int64_t B, int64_t T, int64_t heads, int64_t kv_heads, int64_t head_dim,
                   double theta, const RopeScaling& scaling) {
  rope(dy, dx, B, T, heads, kv_heads, head_dim, theta, scaling, -1.0);
}

#define MEMFIT_REF_INSTANTIATE(F)                                                                                   \
  template void rmsnorm_forward<F>(const F*, const F*, F*, F*, int64_t, int64_t, double);                          \
  template void rmsnorm_backward<F>(const F*, const F*, const F*, const F*, F*, F*, int64_t, int64_t, bool, bool); \
  template void swiglu_forward<F>(const F*, const F*, F*, int64_t);                                                 \
  template void swiglu_backward<F>(const F*, const F*, const F*, F*, F*, int64_t, bool, bool);                      \
  template void rope_forward<F>(const F*, F*, int64_t, int64_t, int64_t, int64_t, int64_t, double, const RopeScaling&);                 \
  template void rope_backward<F>(const F*, F*, int64_t, int64_t, int64_t, int64_t, int64_t, double, const RopeScaling&);

MEMFIT_REF_INSTANTIATE(float)
MEMFIT_REF_INSTANTIATE(double)
#undef MEMFIT_REF_INSTANTIATE

}  // namespace memfit::ref
