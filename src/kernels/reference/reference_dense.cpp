// Reference kernels for the row-wise and elementwise ops, matmul and AdamW (see
// reference.hpp). Accumulation is in double whatever F is, so that a float instantiation is
// as close to the exact value as its inputs allow, and the double instantiation serves the
// finite-difference checks.
#include <cmath>
#include <cstring>

#include "core/error.hpp"
#include "kernels/reference/reference.hpp"

#include "core/dropout_mask.hpp"

namespace memfit::ref {
namespace {

template <class F>
void store(F* dst, double value, bool acc) {
  *dst = acc ? F(double(*dst) + value) : F(value);
}

constexpr double kGeluC = 0.7978845608028654;  // sqrt(2/pi)
constexpr double kGeluA = 0.044715;

}  // namespace

template <class F>
void embedding_forward(const int32_t* tokens, const F* wte, const F* wpe, F* x, int64_t N, int64_t seq, int64_t C,
                       bool acc, int64_t vocab_begin, int64_t vocab_rows) {
  for (int64_t n = 0; n < N; ++n) {
    const int64_t t = n % seq, row = int64_t(tokens[n]) - vocab_begin;
    MEMFIT_ASSERT(tokens[n] >= 0, "token {} is negative", tokens[n]);
    const bool held = vocab_rows < 0 || (row >= 0 && row < vocab_rows);
    for (int64_t c = 0; c < C; ++c)
      store(&x[n * C + c], (held ? double(wte[row * C + c]) : 0.0) + (wpe ? double(wpe[t * C + c]) : 0.0), acc);
  }
}

template <class F>
void embedding_backward(const F* dx, const int32_t* tokens, F* dwte, F* dwpe, int64_t N, int64_t seq, int64_t C,
                        int64_t vocab_rows, int64_t max_seq, bool acc_wte, bool acc_wpe, int64_t vocab_begin,
                        bool sliced) {
  if (dwte) {
    if (!acc_wte)
      for (int64_t i = 0; i < vocab_rows * C; ++i) dwte[i] = F(0);
    for (int64_t n = 0; n < N; ++n) {
      const int64_t tok = tokens[n], row = tok - vocab_begin;
      MEMFIT_ASSERT(tok >= 0 && (sliced || row < vocab_rows), "token {} outside [0, {})", tok, vocab_rows);
      if (row < 0 || row >= vocab_rows) continue;  // another rank's slice holds it
      for (int64_t c = 0; c < C; ++c) dwte[row * C + c] += dx[n * C + c];
    }
  }
  if (dwpe) {
    if (!acc_wpe)
      for (int64_t i = 0; i < max_seq * C; ++i) dwpe[i] = F(0);
    for (int64_t t = 0; t < seq; ++t)
      for (int64_t c = 0; c < C; ++c) {
        double s = 0;
        for (int64_t n = t; n < N; n += seq) s += double(dx[n * C + c]);
        dwpe[t * C + c] = F(double(dwpe[t * C + c]) + s);
      }
  }
}

template <class F>
void layernorm_forward(const F* x, const F* w, const F* b, F* y, F* mean, F* rstd, int64_t N, int64_t C, double eps) {
  for (int64_t n = 0; n < N; ++n) {
    const F* xr = x + n * C;
    double mu = 0;
    for (int64_t c = 0; c < C; ++c) mu += double(xr[c]);
    mu /= double(C);
    double var = 0;
    for (int64_t c = 0; c < C; ++c) var += (double(xr[c]) - mu) * (double(xr[c]) - mu);
    var /= double(C);
    const double rs = 1.0 / std::sqrt(var + eps);
    for (int64_t c = 0; c < C; ++c) y[n * C + c] = F((double(xr[c]) - mu) * rs * double(w[c]) + double(b[c]));
    if (mean) mean[n] = F(mu);
    if (rstd) rstd[n] = F(rs);
  }
}

template <class F>
void layernorm_backward(const F* dy, const F* x, const F* w, const F* mean, const F* rstd, F* dx, F* dw, F* db,
                        int64_t N, int64_t C, bool acc_dx, bool acc_dw, bool acc_db) {
  for (int64_t c = 0; c < C; ++c) {
    double sw = 0, sb = 0;
    for (int64_t n = 0; n < N; ++n) {
      const double xhat = (double(x[n * C + c]) - double(mean[n])) * double(rstd[n]);
      sw += double(dy[n * C + c]) * xhat;
      sb += double(dy[n * C + c]);
    }
    if (dw) store(&dw[c], sw, acc_dw);
    if (db) store(&db[c], sb, acc_db);
  }
  if (!dx) return;
  for (int64_t n = 0; n < N; ++n) {
    // dx = rstd * (g - mean(g) - xhat * mean(g * xhat)) with g = dy * w.
    double mg = 0, mgx = 0;
    for (int64_t c = 0; c < C; ++c) {
      const double xhat = (double(x[n * C + c]) - double(mean[n])) * double(rstd[n]);
      const double g = double(dy[n * C + c]) * double(w[c]);
      mg += g;
      mgx += g * xhat;
    }
    mg /= double(C);
    mgx /= double(C);
    for (int64_t c = 0; c < C; ++c) {
      const double xhat = (double(x[n * C + c]) - double(mean[n])) * double(rstd[n]);
      const double g = double(dy[n * C + c]) * double(w[c]);
      store(&dx[n * C + c], double(rstd[n]) * (g - mg - xhat * mgx), acc_dx);
    }
  }
}

template <class F>
void matmul(const F* a, const F* b, const F* bias, F* c, int64_t M, int64_t N, int64_t K, bool trans_a,
            bool trans_b, double alpha, bool acc) {
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      double s = 0;
      for (int64_t k = 0; k < K; ++k) {
        const double av = trans_a ? double(a[k * M + i]) : double(a[i * K + k]);
        const double bv = trans_b ? double(b[j * K + k]) : double(b[k * N + j]);
        s += av * bv;
      }
      s *= alpha;
      if (bias) s += double(bias[j]);
      store(&c[i * N + j], s, acc);
    }
}

template <class F>
void bias_grad(const F* dy, F* db, int64_t M, int64_t N, bool acc) {
  for (int64_t j = 0; j < N; ++j) {
    double s = 0;
    for (int64_t i = 0; i < M; ++i) s += double(dy[i * N + j]);
    store(&db[j], s, acc);
  }
}

template <class F>
void gelu_forward(const F* x, F* y, int64_t n, bool acc) {
  for (int64_t i = 0; i < n; ++i) {
    const double v = double(x[i]);
    store(&y[i], 0.5 * v * (1.0 + std::tanh(kGeluC * (v + kGeluA * v * v * v))), acc);
  }
}

template <class F>
void gelu_backward(const F* dy, const F* x, F* dx, int64_t n, bool acc) {
  for (int64_t i = 0; i < n; ++i) {
    const double v = double(x[i]);
    const double th = std::tanh(kGeluC * (v + kGeluA * v * v * v));
    const double du = kGeluC * (1.0 + 3.0 * kGeluA * v * v);
    const double d = 0.5 * (1.0 + th) + 0.5 * v * (1.0 - th * th) * du;
    store(&dx[i], double(dy[i]) * d, acc);
  }
}

template <class F>
void add(const F* a, const F* b, F* y, int64_t n, bool acc) {
  for (int64_t i = 0; i < n; ++i) store(&y[i], double(a[i]) + double(b[i]), acc);
}

template <class F>
void accumulate(const F* x, F* y, int64_t n, bool acc) {
  for (int64_t i = 0; i < n; ++i) store(&y[i], double(x[i]), acc);
}

template <class F>
void fill(F* x, int64_t n, double value, bool acc) {
  for (int64_t i = 0; i < n; ++i) store(&x[i], value, acc);
}

template <class F>
void loss_mean(const F* losses, F* loss, int64_t n, double scale, bool acc) {
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += double(losses[i]);
  store(loss, scale * s, acc);
}

template <class F>
void adamw(F* param, const F* grad, F* m, F* v, int64_t n, double lr, double beta1, double beta2, double eps,
           double weight_decay, int64_t step, double grad_scale) {
  const double bc1 = 1.0 - std::pow(beta1, double(step));
  const double bc2 = 1.0 - std::pow(beta2, double(step));
  for (int64_t i = 0; i < n; ++i) {
    const double g = double(grad[i]) * grad_scale;
    double p = double(param[i]) * (1.0 - lr * weight_decay);
    const double mi = beta1 * double(m[i]) + (1.0 - beta1) * g;
    const double vi = beta2 * double(v[i]) + (1.0 - beta2) * g * g;
    p -= (lr / bc1) * mi / (std::sqrt(vi) / std::sqrt(bc2) + eps);
    param[i] = F(p);
    m[i] = F(mi);
    v[i] = F(vi);
  }
}

#define MEMFIT_REF_INSTANTIATE(F)                                                                                   \
  template void embedding_forward<F>(const int32_t*, const F*, const F*, F*, int64_t, int64_t, int64_t, bool,       \
                                     int64_t, int64_t);                                                             \
  template void embedding_backward<F>(const F*, const int32_t*, F*, F*, int64_t, int64_t, int64_t, int64_t, int64_t, \
                                      bool, bool, int64_t, bool);                                                   \
  template void layernorm_forward<F>(const F*, const F*, const F*, F*, F*, F*, int64_t, int64_t, double);           \
  template void layernorm_backward<F>(const F*, const F*, const F*, const F*, const F*, F*, F*, F*, int64_t, int64_t, \
                                      bool, bool, bool);                                                            \
  template void matmul<F>(const F*, const F*, const F*, F*, int64_t, int64_t, int64_t, bool, bool, double, bool);   \
  template void bias_grad<F>(const F*, F*, int64_t, int64_t, bool);                                                 \
  template void gelu_forward<F>(const F*, F*, int64_t, bool);                                                       \
  template void gelu_backward<F>(const F*, const F*, F*, int64_t, bool);                                            \
  template void add<F>(const F*, const F*, F*, int64_t, bool);                                                      \
  template void accumulate<F>(const F*, F*, int64_t, bool);                                                         \
  template void fill<F>(F*, int64_t, double, bool);                                                                 \
  template void loss_mean<F>(const F*, F*, int64_t, double, bool);                                                  \
  template void adamw<F>(F*, const F*, F*, F*, int64_t, double, double, double, double, double, int64_t, double);

MEMFIT_REF_INSTANTIATE(float)
MEMFIT_REF_INSTANTIATE(double)
#undef MEMFIT_REF_INSTANTIATE

void add_columns(const float* a, const float* d, float* y, int64_t rows, int64_t cols, int64_t begin, int64_t width,
                 bool acc) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      double v = a[r * cols + c];
      if (c >= begin && c < begin + width) v += d[r * width + (c - begin)];
      y[r * cols + c] = float(acc ? double(y[r * cols + c]) + v : v);
    }
}

void slice_columns(const float* x, float* y, int64_t rows, int64_t cols, int64_t begin, int64_t width, bool acc) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < width; ++c) {
      const float v = x[r * cols + begin + c];
      y[r * width + c] = acc ? y[r * width + c] + v : v;
    }
}

void dropout(const float* x, float* y, int64_t n, float p, uint64_t key, const DropoutLayout& layout, bool acc) {
  const uint32_t threshold = dropout_threshold(p);
  const float scale = float(1.0 / (1.0 - double(p)));
  for (int64_t i = 0; i < n; ++i) {
    const float v = dropout_keeps(key, layout.index(i), threshold) ? x[i] * scale : 0.0f;
    y[i] = acc ? y[i] + v : v;
  }
}

}  // namespace memfit::ref
