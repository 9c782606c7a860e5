#include "train/lora_start_factors.hpp"

#include <algorithm>
#include <cmath>

#include <lapacke.h>

#include "core/error.hpp"
#include "kernels/cpu/dnnl_matmul.hpp"
#include "train/rng.hpp"

namespace memfit {

namespace {

// C [m, n] = alpha op(A) op(B) (+ C when accumulating), packed row-major operands, through a
// oneDNN matmul primitive with its scratchpad here. (oneDNN's dnnl_sgemm would do, but its first
// call maps ~7 MB of buffers that no plan holds; a primitive's memory is what it reports.)
void gemm(char ta, char tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a, const float* b,
          bool accumulate, float* c) {
  static const DnnlEnv env = DnnlEnv::make_cpu();
  DnnlMatmulSpec spec;
  spec.src = dnnl_matrix(m, k, ta == 'T');
  spec.wei = dnnl_matrix(k, n, tb == 'T');
  spec.dst = dnnl_matrix(m, n, false);
  spec.scale = alpha;
  spec.accumulate = accumulate;
  DnnlMatmul product(env, spec);
  std::vector<std::byte> scratch(product.scratch_bytes());
  product.execute(product.bind(a, b, nullptr, c, scratch.empty() ? nullptr : scratch.data()));
}

// Orthonormal columns spanning M [n, b] (Householder QR: LAPACK's geqrf + orgqr), in place.
// The upper triangle geqrf leaves (R) goes to r_out [b, b] when given.
void orthonormalize(std::vector<float>& m, int64_t n, int64_t b, std::vector<float>* r_out = nullptr) {
  std::vector<float> tau(static_cast<size_t>(b));
  lapack_int info = LAPACKE_sgeqrf(LAPACK_ROW_MAJOR, lapack_int(n), lapack_int(b), m.data(), lapack_int(b), tau.data());
  MEMFIT_CHECK(info == 0, "lora", "LAPACK sgeqrf of a {} x {} panel failed ({})", n, b, int(info));
  if (r_out) {
    r_out->assign(size_t(b * b), 0.0f);
    for (int64_t i = 0; i < b; ++i)
      for (int64_t j = i; j < b; ++j) (*r_out)[size_t(i * b + j)] = m[size_t(i * b + j)];
  }
  info = LAPACKE_sorgqr(LAPACK_ROW_MAJOR, lapack_int(n), lapack_int(b), lapack_int(b), m.data(), lapack_int(b),
                        tau.data());
  MEMFIT_CHECK(info == 0, "lora", "LAPACK sorgqr of a {} x {} panel failed ({})", n, b, int(info));
}

// Reads W a chunk of rows at a time: fn(first, count, rows).
template <typename Fn>
void for_chunks(const FactorShape& s, const WeightRows& read, Fn&& fn) {
  std::vector<float> chunk(size_t(std::min(s.chunk_rows, s.rows) * s.cols));
  for (int64_t f = 0; f < s.rows; f += s.chunk_rows) {
    const int64_t h = std::min(s.chunk_rows, s.rows - f);
    const std::span<float> rows(chunk.data(), size_t(h * s.cols));
    read(f, h, rows);
    fn(f, h, rows);
  }
}

// Y [rows, b] = W X^T for X [b, cols].
void times_rows_transposed(const FactorShape& s, const WeightRows& read, const std::vector<float>& x, int64_t b,
                           std::vector<float>& y) {
  y.assign(size_t(s.rows * b), 0.0f);
  for_chunks(s, read, [&](int64_t f, int64_t h, std::span<float> rows) {
    gemm('N', 'T', h, b, s.cols, 1.0f, rows.data(), x.data(), false, y.data() + f * b);
  });
}

// P [b, cols] = Q^T W for Q [rows, b].
void transposed_times(const FactorShape& s, const WeightRows& read, const std::vector<float>& q, int64_t b,
                      std::vector<float>& p) {
  p.assign(size_t(b * s.cols), 0.0f);
  for_chunks(s, read, [&](int64_t f, int64_t h, std::span<float> rows) {
    gemm('T', 'N', b, s.cols, h, 1.0f, q.data() + f * b, rows.data(), true, p.data());
  });
}

struct Ritz {
  std::vector<float> sigma;  // [b]
  std::vector<float> left;   // [b, b]: W's left vectors are Q left
  std::vector<float> right;  // [b, cols]: rows are W's right vectors
};

// The SVD of P [b, cols] (LAPACK sgesvd, thin).
Ritz svd_of_panel(std::vector<float> p, int64_t b, int64_t cols) {
  Ritz r;
  r.sigma.resize(size_t(b));
  r.left.resize(size_t(b * b));
  r.right.resize(size_t(b * cols));
  std::vector<float> superb(size_t(std::max<int64_t>(b, 2)));
  const lapack_int info = LAPACKE_sgesvd(LAPACK_ROW_MAJOR, 'S', 'S', lapack_int(b), lapack_int(cols), p.data(),
                                         lapack_int(cols), r.sigma.data(), r.left.data(), lapack_int(b),
                                         r.right.data(), lapack_int(cols), superb.data());
  MEMFIT_CHECK(info == 0, "lora", "LAPACK sgesvd of a {} x {} panel failed ({})", b, cols, int(info));
  return r;
}

}  // namespace

LowRankFactors olora_factors(const FactorShape& s, const WeightRows& read) {
  const int64_t r = s.rank;
  MEMFIT_ASSERT(r >= 1 && r <= std::min(s.rows, s.cols), "OLoRA rank {} of a {} x {} weight", r, s.rows, s.cols);
  std::vector<float> q(size_t(s.rows * r));  // W's first r columns, then Q_r
  for_chunks(s, read, [&](int64_t f, int64_t h, std::span<float> rows) {
    for (int64_t i = 0; i < h; ++i) std::copy_n(rows.data() + i * s.cols, r, q.data() + (f + i) * r);
  });
  std::vector<float> r11;
  orthonormalize(q, s.rows, r, &r11);
  LowRankFactors out;
  out.rank = r;
  transposed_times(s, read, q, r, out.a);  // R's first r rows = Q_r^T W
  // Its first r columns are geqrf's own R (exactly upper triangular), as torch's full QR has them.
  for (int64_t i = 0; i < r; ++i)
    for (int64_t j = 0; j < r; ++j) out.a[size_t(i * s.cols + j)] = r11[size_t(i * r + j)];
  out.b = std::move(q);
  return out;
}

LowRankFactors pissa_factors(const FactorShape& s, double scale, int niter, uint64_t seed, const WeightRows& read,
                             const std::string& what) {
  const int64_t r = s.rank, mn = std::min(s.rows, s.cols);
  MEMFIT_ASSERT(r >= 1 && r <= mn, "PiSSA rank {} of a {} x {} weight", r, s.rows, s.cols);
  // "pissa": oversampled, so that convergence goes as (sigma_{b+1} / sigma_r)^2 per iteration.
  const int64_t b = niter >= 0 ? r : std::min(mn, 2 * r + 4);
  std::vector<float> omega(size_t(b * s.cols));  // the Gaussian start, as rows of X
  Rng rng(seed);
  for (float& v : omega) v = float(rng.normal());
  std::vector<float> q, p, y;
  times_rows_transposed(s, read, omega, b, q);
  orthonormalize(q, s.rows, b);
  const int64_t cap = niter >= 0 ? niter : 2000;
  const double tolerance = std::max(1e-6, 4.0 * 0x1.0p-24 * std::sqrt(double(s.cols)));
  double best = INFINITY;
  int64_t best_at = 0;
  Ritz ritz;
  std::vector<float> u;  // Q left: the Ritz left vectors [rows, b]
  auto left_vectors = [&] {
    u.resize(size_t(s.rows * b));
    gemm('N', 'N', s.rows, b, b, 1.0f, q.data(), ritz.left.data(), false, u.data());
  };
  for (int64_t it = 0;; ++it) {
    transposed_times(s, read, q, b, p);  // P = Q^T W: its SVD gives the Ritz triplets
    ritz = svd_of_panel(p, b, s.cols);
    if (niter >= 0 && it == cap) {
      left_vectors();
      break;
    }
    times_rows_transposed(s, read, ritz.right, b, y);  // Y = W V: the next basis, and the residuals
    if (niter < 0) {
      // ||W v_i - sigma_i u_i|| for the top r (W^T u_i - sigma_i v_i is 0 by construction).
      left_vectors();
      double worst = 0;
      for (int64_t i = 0; i < r; ++i) {
        double sum = 0;
        for (int64_t k = 0; k < s.rows; ++k) {
          const double d = double(y[size_t(k * b + i)]) - double(ritz.sigma[size_t(i)]) * u[size_t(k * b + i)];
          sum += d * d;
        }
        worst = std::max(worst, std::sqrt(sum));
      }
      const double rel = worst / std::max(double(ritz.sigma[0]), 1e-30);
      if (rel <= tolerance) break;
      if (rel < 0.9 * best) best = rel, best_at = it;
      // No progress for 50 iterations: fp32's floor (accepted when small) or a gap too small to tell.
      if (it - best_at >= 50 || it == cap) {
        MEMFIT_CHECK(best <= 1e-4, "lora",
                     "PiSSA: the top {} singular vectors of {} do not converge (residual {:.2g} of sigma_1 after {} "
                     "iterations; sigma_{} = {:.6g}, sigma_{} = {:.6g}): use pissa_niter_N", r, what, rel, it + 1, r,
                     ritz.sigma[size_t(r - 1)], r + 1, ritz.sigma[size_t(std::min(r, b - 1))]);
        break;
      }
    }
    q = std::move(y);
    orthonormalize(q, s.rows, b);
  }
  // B = u[:, :r] sqrt(S_r / scale), A = sqrt(S_r / scale) V_r^T; each pair's sign fixed so that
  // its left vector's largest entry is positive (the factorisation leaves it free).
  LowRankFactors out;
  out.rank = r;
  out.a.resize(size_t(r * s.cols));
  out.b.resize(size_t(s.rows * r));
  for (int64_t i = 0; i < r; ++i) {
    int64_t at = 0;
    for (int64_t k = 1; k < s.rows; ++k)
      if (std::fabs(u[size_t(k * b + i)]) > std::fabs(u[size_t(at * b + i)])) at = k;
    const double sign = u[size_t(at * b + i)] < 0 ? -1.0 : 1.0;
    const double root = std::sqrt(double(ritz.sigma[size_t(i)]) / scale);
    for (int64_t k = 0; k < s.rows; ++k) out.b[size_t(k * r + i)] = float(sign * root * u[size_t(k * b + i)]);
    for (int64_t j = 0; j < s.cols; ++j)
      out.a[size_t(i * s.cols + j)] = float(sign * root * ritz.right[size_t(i * s.cols + j)]);
  }
  return out;
}

void subtract_low_rank(std::span<float> rows, int64_t first, int64_t count, int64_t cols, const LowRankFactors& f,
                       double scale) {
  MEMFIT_ASSERT(int64_t(rows.size()) == count * cols, "{} values for {} rows of {}", rows.size(), count, cols);
  gemm('N', 'N', count, cols, f.rank, float(-scale), f.b.data() + first * f.rank, f.a.data(), true, rows.data());
}

void subtract_low_rank_elements(std::span<float> values, int64_t first, int64_t cols, const LowRankFactors& f,
                                double scale) {
  const int64_t end = first + int64_t(values.size());
  for (int64_t e = first; e < end;) {
    const int64_t row = e / cols, c0 = e % cols;
    if (c0 == 0 && end - e >= cols) {  // whole rows: one product
      const int64_t h = (end - e) / cols;
      subtract_low_rank(values.subspan(size_t(e - first), size_t(h * cols)), row, h, cols, f, scale);
      e += h * cols;
      continue;
    }
    const int64_t c1 = std::min(cols, c0 + (end - e));
    for (int64_t c = c0; c < c1; ++c) {
      double d = 0;
      for (int64_t k = 0; k < f.rank; ++k) d += double(f.b[size_t(row * f.rank + k)]) * f.a[size_t(k * cols + c)];
      values[size_t(e - first + (c - c0))] -= float(scale * d);
    }
    e += c1 - c0;
  }
}

uint64_t factor_scratch_bytes(int64_t rows, int64_t cols, int64_t rank, bool pissa, int niter) {
  const int64_t b = !pissa || niter >= 0 ? rank : std::min(std::min(rows, cols), 2 * rank + 4);
  // The factors (A, B) and, for PiSSA, the start, Q, Y, U, P, its SVD's right vectors and
  // LAPACKE's row-major copies of the panel it factors.
  const int64_t floats = rank * (rows + cols) + (pissa ? 4 * rows * b + 4 * b * cols : 2 * rows * rank);
  return uint64_t(floats) * sizeof(float);
}

}  // namespace memfit
