// fp32 products on packed strips of B (see sgemm.hpp).
//
// Measured on the 2 Sapphire Rapids cores (docs/benchmarks.md) with the caches flushed before
// each call: kSgemmKc = 384 (256 .. 768 swept) and an 8 x 48 register block (against 6 x 64
// and 14 x 32); blocks of 8 strips (a 590 KB packed block, well inside the 2 MB L2) beat 16
// and 32 on wide products ([1024, 768] x [768, 3072] 317 against 283 and 254 GFLOP/s); and
// running each 8-row panel of A over all strips of the block (A panel in L1, strips streaming
// from L2), rather than each strip over 64 rows of A, took the GPT-2 d(input) products from
// 289-337 to 302-355 GFLOP/s (3 alternating runs).
#include "kernels/cpu/avx512_quiet.hpp"  // first: before any intrinsics header
#include "kernels/cpu/sgemm.hpp"

#include <omp.h>

#include <algorithm>

#include "core/error.hpp"
#include "kernels/cpu/parallel.hpp"

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace memfit {
namespace {

constexpr int64_t kMr = kSgemmMr, kNr = kSgemmNr;

int64_t strips_of(int64_t n) { return (n + kNr - 1) / kNr; }

int64_t slice_floats(const SgemmShape& s, int threads) {
  const int64_t per_thread = (strips_of(s.n) + threads - 1) / threads;
  return std::min(kSgemmNcStrips, per_thread) * kNr * std::min(kSgemmKc, s.k);
}

#if defined(__AVX512F__)

__mmask16 lanes_below(int64_t n) { return n >= 16 ? __mmask16(0xFFFF) : n <= 0 ? __mmask16(0) : __mmask16((1u << n) - 1u); }

// One R x 48 block of C over kc packed rows. first: the block of k that starts the sum,
// which adds the old C (add_c) and the bias; later blocks add onto C.
template <int R>
void block(int64_t kc, const float* a, int64_t lda, const float* bp, float* c, int64_t ldc, const __mmask16* mask,
           bool first, bool add_c, const float* bias) {
  __m512 acc[R][3];
#pragma GCC unroll 8
  for (int m = 0; m < R; ++m)
#pragma GCC unroll 3
    for (int v = 0; v < 3; ++v) acc[m][v] = _mm512_setzero_ps();
  for (int64_t k = 0; k < kc; ++k) {
    const __m512 b0 = _mm512_loadu_ps(bp + k * kNr), b1 = _mm512_loadu_ps(bp + k * kNr + 16);
    const __m512 b2 = _mm512_loadu_ps(bp + k * kNr + 32);
    _mm_prefetch(reinterpret_cast<const char*>(bp + (k + 8) * kNr), _MM_HINT_T0);
#pragma GCC unroll 8
    for (int m = 0; m < R; ++m) {
      const __m512 av = _mm512_set1_ps(a[m * lda + k]);
      acc[m][0] = _mm512_fmadd_ps(av, b0, acc[m][0]);
      acc[m][1] = _mm512_fmadd_ps(av, b1, acc[m][1]);
      acc[m][2] = _mm512_fmadd_ps(av, b2, acc[m][2]);
    }
  }
#pragma GCC unroll 8
  for (int m = 0; m < R; ++m)
#pragma GCC unroll 3
    for (int v = 0; v < 3; ++v) {
      if (!mask[v]) continue;
      float* cv = c + m * ldc + 16 * v;
      __m512 r = acc[m][v];
      if (!first || add_c) r = _mm512_add_ps(r, _mm512_maskz_loadu_ps(mask[v], cv));
      if (first && bias) r = _mm512_add_ps(r, _mm512_maskz_loadu_ps(mask[v], bias + 16 * v));
      _mm512_mask_storeu_ps(cv, mask[v], r);
    }
}

using BlockFn = void (*)(int64_t, const float*, int64_t, const float*, float*, int64_t, const __mmask16*, bool, bool,
                         const float*);
BlockFn block_for(int64_t rows) {
  switch (rows) {
    case 1: return block<1>;
    case 2: return block<2>;
    case 3: return block<3>;
    case 4: return block<4>;
    case 5: return block<5>;
    case 6: return block<6>;
    case 7: return block<7>;
    default: return block<8>;
  }
}

// Rows [pc, pc + kc) of B, columns [j0, j0 + cols) (cols <= 48), times alpha, as kc rows of
// 48 floats; columns past `cols` are zero.
void pack_strip(float* bp, const SgemmShape& s, const float* b, int64_t pc, int64_t kc, int64_t j0, int64_t cols) {
  const __mmask16 m0 = lanes_below(cols), m1 = lanes_below(cols - 16), m2 = lanes_below(cols - 32);
  const __m512 alpha = _mm512_set1_ps(s.alpha);
  for (int64_t k = 0; k < kc; ++k) {
    const float* src = b + (pc + k) * s.n + j0;
    float* dst = bp + k * kNr;
    _mm512_storeu_ps(dst, _mm512_mul_ps(alpha, _mm512_maskz_loadu_ps(m0, src)));
    _mm512_storeu_ps(dst + 16, _mm512_mul_ps(alpha, _mm512_maskz_loadu_ps(m1, src + 16)));
    _mm512_storeu_ps(dst + 32, _mm512_mul_ps(alpha, _mm512_maskz_loadu_ps(m2, src + 32)));
  }
}

// Strips [s0, s1) of C, with this thread's slice of the scratch.
void strips_task(const SgemmShape& s, const float* a, const float* b, const float* bias, float* c, bool accumulate,
                 float* bp, int64_t s0, int64_t s1) {
  const int64_t M = s.m, N = s.n, K = s.k;
  for (int64_t sb = s0; sb < s1; sb += kSgemmNcStrips) {
    const int64_t se = std::min(s1, sb + kSgemmNcStrips);
    for (int64_t pc = 0; pc < K; pc += kSgemmKc) {
      const int64_t kc = std::min(kSgemmKc, K - pc);
      for (int64_t st = sb; st < se; ++st)
        pack_strip(bp + (st - sb) * kc * kNr, s, b, pc, kc, st * kNr, std::min(kNr, N - st * kNr));
      // Each 8-row panel of A (8 x kc floats, in L1) runs over every strip of the packed block
      // (in L2) before the next panel is read.
      for (int64_t i = 0; i < M; i += kMr) {
        const BlockFn fn = block_for(std::min(kMr, M - i));
        for (int64_t st = sb; st < se; ++st) {
          const int64_t j0 = st * kNr, cols = std::min(kNr, N - j0);
          const __mmask16 mask[3] = {lanes_below(cols), lanes_below(cols - 16), lanes_below(cols - 32)};
          fn(kc, a + i * K + pc, K, bp + (st - sb) * kc * kNr, c + i * N + j0, N, mask, pc == 0, accumulate,
             bias ? bias + j0 : nullptr);
        }
      }
    }
  }
}

#endif

}  // namespace

uint64_t sgemm_scratch_bytes(const SgemmShape& shape, int threads) {
  return uint64_t(threads) * uint64_t(slice_floats(shape, threads)) * sizeof(float);
}

void sgemm(const SgemmShape& s, const float* a, const float* b, const float* bias, float* c, bool accumulate,
           void* scratch, int threads) {
  MEMFIT_ASSERT(s.m > 0 && s.n > 0 && s.k > 0, "sgemm with empty shape {} x {} x {}", s.m, s.n, s.k);
#if defined(__AVX512F__)
  const int64_t slice = slice_floats(s, threads);
  parallel_for(strips_of(s.n), 0, [&](int64_t s0, int64_t s1) {
    const int t = omp_get_thread_num();
    MEMFIT_ASSERT(t < threads, "sgemm runs on thread {} but has scratch for {}", t, threads);
    strips_task(s, a, b, bias, c, accumulate, static_cast<float*>(scratch) + t * slice, s0, s1);
  });
#else
  // Portable form: the same sums without blocking (and without fused multiply-adds).
  const int64_t M = s.m, N = s.n, K = s.k;
  parallel_for(M, 0, [&](int64_t r0, int64_t r1) {
    for (int64_t i = r0; i < r1; ++i)
      for (int64_t j = 0; j < N; ++j) {
        float sum = 0;
        for (int64_t k = 0; k < K; ++k)
          sum += a[i * K + k] * (s.alpha * b[k * N + j]);
        float& out = c[i * N + j];
        out = (accumulate ? out : 0.0f) + (bias ? bias[j] : 0.0f) + sum;
      }
  });
  (void)scratch;
  (void)threads;
#endif
}

}  // namespace memfit
