// tile_gemm: small dense products on fp32 tiles that sit in cache, for kernels that tile their
// own work (flash attention): C[M,N] (+)= A[M,K] B[K,N].
//
// A is read one element at a time through two strides (element (m, k) at a[m*a_rs + k*a_cs]),
// so a transposed tile (P^T, dS^T in the attention backward) costs no copy: each element is
// broadcast into a vector register anyway. B and C are row-major with leading dimensions.
// With AVX-512 the product is register-blocked (6 rows x 64 columns of C in 24 registers,
// masked vectors for a ragged last column block); elsewhere a scalar loop computes the same
// sums in the same k order (without fused multiply-adds, so the last bits differ); either way
// C is added once to the finished sum in accumulate mode.
//
// Subtle point: the kernel allocates nothing and touches nothing outside the three tiles; the
// oneDNN alternative for products this small either costs microseconds of call overhead per
// tile or (gemm:jit) mallocs packing buffers inside the call.
#pragma once

#include <cstdint>

namespace memfit {

void tile_gemm(int64_t M, int64_t N, int64_t K, const float* a, int64_t a_rs, int64_t a_cs, const float* b,
               int64_t ldb, float* c, int64_t ldc, bool accumulate);

}  // namespace memfit
