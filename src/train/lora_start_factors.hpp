// The low-rank factors that PEFT's base-rewriting LoRA starts take from a base weight W
// [rows = out, cols = in], and the residual they leave it:
//   OLoRA (Büyükakyüz 2024): W = Q R (Householder, as torch.linalg.qr), B = Q[:, :r], A = R[:r];
//   PiSSA (Meng et al. 2024): W = V S U^T, B = V_r sqrt(S_r / scale), A = sqrt(S_r / scale) U_r^T;
// then W <- W - scale B A, so the first forward is the base model's. W is never held whole:
// it is read a chunk of rows at a time (the run's staging), and what is kept is a few panels
// of r or 2r + 4 columns (factor_scratch_bytes). OLoRA needs only the first r columns'
// Householder QR (LAPACK), since those reflectors are the full QR's first r; R's first r rows
// are then Q_r^T W. PiSSA's top singular triplets come from subspace iteration with
// Rayleigh-Ritz (Halko et al. 2011): to convergence for "pissa" (PEFT's full SVD, up to each
// pair's sign), or exactly `niter` power iterations on r columns for "pissa_niter_N" (as
// torch.svd_lowrank, from memfit's own seeded Gaussian start).
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

namespace memfit {

// Rows [first, first + count) of W, row-major, into out (count * cols floats).
using WeightRows = std::function<void(int64_t first, int64_t count, std::span<float> out)>;

struct LowRankFactors {
  int64_t rank = 0;
  std::vector<float> a;  // [rank, cols]
  std::vector<float> b;  // [rows, rank]
};

struct FactorShape {
  int64_t rows = 0, cols = 0, rank = 0;
  int64_t chunk_rows = 0;  // rows per read
};

LowRankFactors olora_factors(const FactorShape& s, const WeightRows& read);

// niter < 0: PEFT's "pissa" (iterates until the top r triplets converge; throws [lora] when they
// do not, as when sigma_r and sigma_{r+1} are too close to tell apart in fp32). niter >= 0:
// "pissa_niter_<niter>". `what` names the weight in errors.
LowRankFactors pissa_factors(const FactorShape& s, double scale, int niter, uint64_t seed, const WeightRows& read,
                             const std::string& what);

// rows (count x cols, W's rows from `first`) -= scale * B[first:first + count] A.
void subtract_low_rank(std::span<float> rows, int64_t first, int64_t count, int64_t cols, const LowRankFactors& f,
                       double scale);

// The same for elements [first, first + values.size()) of W (row-major), which may begin and end
// inside rows: a quantiser's chunk of whole blocks.
void subtract_low_rank_elements(std::span<float> values, int64_t first, int64_t cols, const LowRankFactors& f,
                                double scale);

// Bytes the factorisation holds beside the chunk it reads (its panels and LAPACK's copies).
uint64_t factor_scratch_bytes(int64_t rows, int64_t cols, int64_t rank, bool pissa, int niter);

}  // namespace memfit
