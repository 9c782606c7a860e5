// sgemm: memfit's fp32 matrix product on the CPU, C[M,N] (+)= alpha A[M,K] B[K,N] (+ bias[N])
// for packed row-major operands, neither transposed.
//
// Why not oneDNN for these: oneDNN 2.6's fp32 brgemm multiplies a non-transposed B slowly on
// the 2 cores here (GPT-2 124M's dX = dY W products at 230-275 GFLOP/s, and at ~120 once B
// is wider than 2048 columns, against ~360 for the cores' FMA peak); its older gemm:jit path
// is faster but mallocs megabytes of packing buffers inside every call, which would break
// the plan's promise that nothing is allocated during a step. This kernel packs B into the
// plan's scratch and runs those products at 302-355 GFLOP/s (matmul.hpp says which products
// take it: with a transposed operand oneDNN stayed as fast or faster).
//
// Method (the BLIS structure): B is packed one block of kSgemmKc rows by up to kSgemmNcStrips
// strips of kSgemmNr columns at a time (alpha folded in, the last strip zero-padded); A is
// read in place (broadcast one element at a time); an 8 x 48 register block of C (24
// accumulators) runs over the packed strip. Threads split the columns in whole strips, each
// with its own slice of the scratch and no synchronisation; every element of C is summed by
// one thread in a fixed order, so results do not depend on the thread count.
//
// Summation order: per block of kSgemmKc products, a fused multiply-add chain; the first
// block adds the old C (accumulate) and the bias, later blocks add onto C.
#pragma once

#include <cstdint>

namespace memfit {

inline constexpr int64_t kSgemmMr = 8;           // rows of the register block
inline constexpr int64_t kSgemmNr = 48;          // columns of the register block (3 vectors)
inline constexpr int64_t kSgemmKc = 384;         // rows of B per packed block
inline constexpr int64_t kSgemmNcStrips = 8;     // strips per packed block (384 columns)

struct SgemmShape {
  int64_t m = 0, n = 0, k = 0;
  float alpha = 1.0f;
};

// Scratch for `threads` OpenMP threads (one slice per thread number).
uint64_t sgemm_scratch_bytes(const SgemmShape& shape, int threads);

// bias may be nullptr. accumulate: C += ... instead of C = ....
void sgemm(const SgemmShape& shape, const float* a, const float* b, const float* bias, float* c, bool accumulate,
           void* scratch, int threads);

}  // namespace memfit
