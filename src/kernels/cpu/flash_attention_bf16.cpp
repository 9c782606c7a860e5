// Flash attention's tasks on bf16 storage with AVX512-BF16 (see flash_attention.cpp for the
// formulas and the work split, which are the same): every tile product runs on bf16 operands
// with fp32 sums (tile_dot_bf16), so nothing is widened to fp32 before a product.
//
// Operands, in tile_dot_bf16's 32-bit words of two bf16 values adjacent in k:
// - q, k, v and dy rows are bf16 already: a row's words are its elements in pairs (copied
//   contiguous: strided rows of qkv fall on a few L1 sets), a transposed operand (K^T, V^T,
//   Q^T) is those words transposed, and an operand summed over rows (V, K, Q, dO as the B of
//   P V, dS K, dS^T Q, P^T dO) interleaves two rows per word row;
// - the probabilities and dS are fp32 tiles (the softmax and its statistics stay fp32), rounded
//   to bf16 once, as they enter a product: the rounding is what this path adds to the fp32
//   one (relative 2^-9 per term; every sum stays fp32).
// On the causal diagonal tile, products skip the register blocks that lie wholly in the masked
// triangle (TileCausal): masked probabilities are exact zeros, which add nothing to any sum,
// and masked scores are overwritten before anything reads them.
#include "kernels/cpu/avx512_quiet.hpp"

#include "kernels/cpu/flash_tiles.hpp"

#if defined(__AVX512BF16__)
#include <immintrin.h>

#include <cmath>
#include <limits>

#include "core/error.hpp"
#include "kernels/cpu/tile_dot_bf16.hpp"
#include "kernels/cpu/vec_math_avx512.hpp"

namespace memfit::flash {
namespace {

// Rows of qkv, y and dy lie a page or more apart, where the hardware prefetchers stop: loops
// over them fetch the row kAhead rows on themselves.
constexpr int64_t kAhead = 8;
void prefetch_row(const bf16_t* row, int64_t cols) {
  for (int64_t c = 0; c < cols; c += 32) _mm_prefetch(reinterpret_cast<const char*>(row + c), _MM_HINT_T0);
}

// Words of `rows` rows of `cols` bf16 values: dst[r * ldw + p] = (src[r][2p], src[r][2p + 1]),
// an odd last pair completed with zero.
void copy_words(const bf16_t* src, int64_t ld, int64_t rows, int64_t cols, uint32_t* dst, int64_t ldw) {
  const int64_t padded = 2 * ((cols + 1) / 2);
  for (int64_t r = 0; r < rows; ++r) {
    if (r + kAhead < rows) prefetch_row(src + (r + kAhead) * ld, cols);
    for (int64_t c = 0; c < padded; c += 32) {
      const int64_t left = cols - c, room = padded - c;
      const __mmask32 load = left >= 32 ? ~__mmask32(0) : __mmask32((1u << left) - 1u);
      const __mmask32 store = room >= 32 ? ~__mmask32(0) : __mmask32((1u << room) - 1u);
      const __m512i v = _mm512_maskz_loadu_epi16(load, src + r * ld + c);
      _mm512_mask_storeu_epi16(reinterpret_cast<uint16_t*>(dst + r * ldw) + c, store, v);
    }
  }
}

// The same words transposed: dst[p * ldd + r] = (src[r][2p], src[r][2p + 1]), in blocks of 16
// rows x 16 words through an AVX-512 register transpose (missing rows and words load as zeros
// and are not stored).
void transpose_words(const bf16_t* src, int64_t ld, int64_t rows, int64_t cols, uint32_t* dst, int64_t ldd) {
  const int64_t words = (cols + 1) / 2;
  for (int64_t r0 = 0; r0 < rows; r0 += 16)
    for (int64_t p0 = 0; p0 < words; p0 += 16) {
      const int64_t left = cols - 2 * p0;  // bf16 values of each row from word p0 on
      const __mmask32 load = left >= 32 ? ~__mmask32(0) : __mmask32((1u << left) - 1u);
      __m512i v[16];
      for (int i = 0; i < 16; ++i)
        v[i] = r0 + i < rows ? _mm512_maskz_loadu_epi16(load, src + (r0 + i) * ld + 2 * p0) : _mm512_setzero_si512();
      // Rows 4g..4g+3: lane L of u[g][j] holds them at column 4L + j.
      __m512i u[4][4];
      for (int g = 0; g < 4; ++g) {
        const __m512i *a = v + 4 * g;
        const __m512i t0 = _mm512_unpacklo_epi32(a[0], a[1]), t1 = _mm512_unpackhi_epi32(a[0], a[1]);
        const __m512i t2 = _mm512_unpacklo_epi32(a[2], a[3]), t3 = _mm512_unpackhi_epi32(a[2], a[3]);
        u[g][0] = _mm512_unpacklo_epi64(t0, t2), u[g][1] = _mm512_unpackhi_epi64(t0, t2);
        u[g][2] = _mm512_unpacklo_epi64(t1, t3), u[g][3] = _mm512_unpackhi_epi64(t1, t3);
      }
      const __mmask16 lanes = lanes_below(rows - r0);
      for (int j = 0; j < 4; ++j) {
        // 0x88 takes 128-bit lanes 0 and 2 of each operand, 0xDD lanes 1 and 3.
        const __m512i x0 = _mm512_shuffle_i32x4(u[0][j], u[1][j], 0x88);
        const __m512i y0 = _mm512_shuffle_i32x4(u[0][j], u[1][j], 0xDD);
        const __m512i x1 = _mm512_shuffle_i32x4(u[2][j], u[3][j], 0x88);
        const __m512i y1 = _mm512_shuffle_i32x4(u[2][j], u[3][j], 0xDD);
        const __m512i out[4] = {_mm512_shuffle_i32x4(x0, x1, 0x88), _mm512_shuffle_i32x4(y0, y1, 0x88),
                                _mm512_shuffle_i32x4(x0, x1, 0xDD), _mm512_shuffle_i32x4(y0, y1, 0xDD)};
        for (int L = 0; L < 4; ++L) {
          const int64_t p = p0 + 4 * L + j;
          if (p < words) _mm512_mask_storeu_epi32(dst + p * ldd + r0, lanes, out[L]);
        }
      }
    }
}

// Two rows per word row: dst[(r / 2) * ldw + c] = (src[r][c], src[r + 1][c]), a missing last
// row read as zero.
void interleave_rows(const bf16_t* src, int64_t ld, int64_t rows, int64_t cols, uint32_t* dst, int64_t ldw) {
  for (int64_t r = 0; r < rows; r += 2) {
    const bf16_t *lo = src + r * ld, *hi = src + (r + 1) * ld;
    const bool has_hi = r + 1 < rows;
    for (int64_t c = 0; c < cols; c += 16) {
      const __mmask16 m = lanes_below(cols - c);
      const __m512i a = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, lo + c));
      const __m512i b = has_hi ? _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, hi + c)) : _mm512_setzero_si512();
      _mm512_mask_storeu_epi32(dst + (r / 2) * ldw + c, m, _mm512_or_si512(a, _mm512_slli_epi32(b, 16)));
    }
  }
}

int64_t pairs(int64_t n) { return (n + 1) / 2; }

// Two rows' 16-column vectors as words of row pairs (lo in the low halves).
__m512i pair_words(__m512 lo, __m512 hi) {
  const __m512i order = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6, 21,
                                         5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  return _mm512_permutexvar_epi16(order, (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
}

// Query lanes [16 v, 16 v + 16) of the tile that key c sees: all of them below the diagonal,
// on it the queries r >= c; and only the tile's br queries.
__mmask16 visible_lanes(int64_t c, int64_t v, int64_t br, bool diagonal) {
  const int64_t lo = 16 * v, hi = std::min(br, lo + 16);
  if (hi <= lo) return 0;
  __mmask16 m = __mmask16((1u << (hi - lo)) - 1u);
  if (diagonal) m = c <= lo ? m : c >= hi ? __mmask16(0) : __mmask16(m & ~((1u << (c - lo)) - 1u));
  return m;
}

// The online softmax of one tile of s^T (keys in rows, queries in the lanes; see forward_task
// in flash_attention.cpp): updates m and l, leaves the correction of each query in corr and
// rescales acc by it, and writes the probabilities as bf16 words P[pair of keys][query] into
// pk (masked ones exact zeros). st itself is only read.
void online_softmax(const Geometry& g, const float* st, int64_t bc, int64_t br, bool diagonal, bool first, float* m,
                    float* l, float* corr, float* acc, uint32_t* pk) {
  for (int64_t v = 0; 16 * v < br; ++v) {
    __m512 mx = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
    for (int64_t c = 0; c < bc; ++c)
      mx = _mm512_mask_max_ps(mx, visible_lanes(c, v, br, diagonal), mx, _mm512_loadu_ps(st + c * kB + 16 * v));
    const __m512 m_old = _mm512_loadu_ps(m + 16 * v);
    const __m512 m_new = first ? mx : _mm512_max_ps(mx, m_old);
    const __m512 cv = first ? _mm512_setzero_ps() : softmax_exp16(_mm512_sub_ps(m_old, m_new), 0xFFFF);
    __m512 sum = _mm512_setzero_ps();
    for (int64_t c = 0; c < bc; c += 2) {
      const __mmask16 k0 = visible_lanes(c, v, br, diagonal);
      const __mmask16 k1 = c + 1 < bc ? visible_lanes(c + 1, v, br, diagonal) : __mmask16(0);
      const __m512 e0 = softmax_exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(k0, st + c * kB + 16 * v), m_new), k0);
      const __m512 e1 = softmax_exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(k1, st + (c + 1) * kB + 16 * v), m_new), k1);
      sum = _mm512_add_ps(_mm512_add_ps(sum, e0), e1);
      _mm512_storeu_si512(pk + c / 2 * kB + 16 * v, pair_words(e0, e1));
    }
    const __m512 l_old = _mm512_loadu_ps(l + 16 * v);
    _mm512_storeu_ps(l + 16 * v, first ? sum : _mm512_fmadd_ps(l_old, cv, sum));
    _mm512_storeu_ps(m + 16 * v, m_new);
    _mm512_storeu_ps(corr + 16 * v, cv);
  }
  if (first) return;
  for (int64_t r = 0; r < br; ++r) {
    if (corr[r] == 1.0f) continue;
    float* a = acc + r * g.HS;
#pragma omp simd
    for (int64_t d = 0; d < g.HS; ++d) a[d] *= corr[r];
  }
}

}  // namespace

int64_t bf16_forward_floats(int64_t HS) {
  const int64_t hp = pairs(HS);
  return round_up(hp * kB, 16) * 2 + round_up(kB * kB, 16) + round_up(kB / 2 * HS, 16) + round_up(kB / 2 * kB, 16) +
         round_up(kB * HS, 16) + round_up(kB, 16) * 3;
}

int64_t bf16_backward_floats(int64_t T, int64_t HS, int64_t G) {
  const int64_t hp = pairs(HS);
  return G * (round_up(T, 16) + round_up(T * HS, 16)) + round_up(hp * kB, 16) * 4 + round_up(kB / 2 * HS, 16) * 3 +
         round_up(kB * kB, 16) * 2 + round_up(kB / 2 * kB, 16) + round_up(kB * HS, 16) * 2;
}

// One query block of one head: s^T = K_j Q_i^T as in flash_attention.cpp's forward_task.
void bf16_forward_task(const Geometry& g, const bf16_t* qkv, bf16_t* y, float* lse, int64_t bh, int64_t qi, float* ws) {
  const int64_t b = bh / g.NH, h = bh % g.NH, HS = g.HS, hp = pairs(HS), ld = g.W;
  const int64_t q0 = qi * kB, br = g.size(qi);
  const bf16_t* row0 = qkv + b * g.T * ld;
  const bf16_t *kbase = row0 + g.shape.k_col(h / g.G), *vbase = row0 + g.shape.v_col(h / g.G);
  Carver carve(ws);
  uint32_t* qt = carve.take_words(hp * kB);  // Q_i^T: [pair of d][query]
  uint32_t* kw = carve.take_words(kB * hp);  // K_j: [key][pair of d]
  float* st = carve.take(kB * kB);           // s^T, then p^T: [key][query]
  uint32_t* vv = carve.take_words(kB / 2 * HS);  // V_j: [pair of keys][d]
  uint32_t* pk = carve.take_words(kB / 2 * kB);  // P: [pair of keys][query]
  float* acc = carve.take(kB * HS);
  float* m = carve.take(kB);
  float* l = carve.take(kB);
  float* corr = carve.take(kB);
  MEMFIT_ASSERT(carve.used(ws) <= bf16_forward_floats(HS), "flash forward scratch overrun");
  transpose_words(row0 + g.shape.q_col(h) + q0 * ld, ld, br, HS, qt, kB);
  for (int64_t kj = 0; kj <= qi; ++kj) {
    const int64_t k0 = kj * kB, bc = g.size(kj);
    const bool diagonal = kj == qi;
    copy_words(kbase + k0 * ld, ld, bc, HS, kw, hp);
    tile_dot_bf16(bc, br, hp, kw, hp, 1, qt, kB, st, kB, g.scale, false,
                  diagonal ? TileCausal::cols_from_row : TileCausal::none);
    online_softmax(g, st, bc, br, diagonal, kj == 0, m, l, corr, acc, pk);
    interleave_rows(vbase + k0 * ld, ld, bc, HS, vv, HS);
    // acc[r] += sum_c p[r][c] V[c]: P read from its words (row stride 1, pair stride kB).
    tile_dot_bf16(br, HS, pairs(bc), pk, 1, kB, vv, HS, acc, HS, 1.0f, kj > 0,
                  diagonal ? TileCausal::k_to_row : TileCausal::none);
  }
  bf16_t* yb = y + (b * g.T + q0) * g.C + h * HS;
  float* lb = lse + bh * g.T + q0;
  for (int64_t r = 0; r < br; ++r) {
    store_row(yb + r * g.C, acc + r * HS, HS, 1.0f / l[r], false);
    lb[r] = m[r] + std::log(l[r]);
  }
}

namespace {

// D_t = dy_t . y_t for every row of query head `h` (fp32 sums of the widened rows).
void row_dots(const Geometry& g, const bf16_t* dyb, const bf16_t* yb, float* D) {
  for (int64_t t = 0; t < g.T; ++t) {
    const bf16_t *o = yb + t * g.C, *d = dyb + t * g.C;
    if (t + kAhead < g.T) prefetch_row(o + kAhead * g.C, g.HS), prefetch_row(d + kAhead * g.C, g.HS);
    float dot = 0;
#pragma omp simd reduction(+ : dot)
    for (int64_t c = 0; c < g.HS; ++c) dot += widen(o[c]) * widen(d[c]);
    D[t] = dot;
  }
}

// Columns [c0, c0 + 16) of the tile's row r that are visible: c < min(bc, r + offset).
__mmask16 visible_columns(int64_t r, int64_t c0, int64_t offset, int64_t bc) {
  return lanes_below(std::min(bc, r + offset) - c0);
}

// p = softmax_exp(s - lse) over the visible columns of rows [0, br) of the tile (query r sees
// key c when c < min(bc, r + offset)), exact zeros elsewhere in its kB columns, in place; and
// the rows in pairs as bf16 words [pair of queries][key] into pk.
void tile_probs(float* p, int64_t br, const float* lse, int64_t offset, int64_t bc, uint32_t* pk) {
  for (int64_t r = 0; r < br; r += 2) {
    const bool pair = r + 1 < br;
    const __m512 s0 = _mm512_set1_ps(lse[r]), s1 = _mm512_set1_ps(pair ? lse[r + 1] : 0.0f);
    for (int64_t c = 0; c < kB; c += 16) {
      const __mmask16 k0 = visible_columns(r, c, offset, bc), k1 = pair ? visible_columns(r + 1, c, offset, bc) : 0;
      float *row0 = p + r * kB + c, *row1 = row0 + kB;
      const __m512 e0 = softmax_exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(k0, row0), s0), k0);
      const __m512 e1 = softmax_exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(k1, row1), s1), k1);
      _mm512_storeu_ps(row0, e0);
      if (pair) _mm512_storeu_ps(row1, e1);
      _mm512_storeu_si512(pk + r / 2 * kB + c, pair_words(e0, e1));
    }
  }
}

// ds = scale p (dp - D) over the visible columns of rows [0, br) (dp in ds; zeros elsewhere),
// as bf16 words twice: rows in pairs into pk ([pair of queries][key]) and each row's own words
// (pairs of adjacent keys) in place in the first half of its row of ds.
void tile_dscores(const float* p, float* ds, int64_t br, const float* D, float scale, int64_t offset, int64_t bc,
                  uint32_t* pk) {
  const __m512 sc = _mm512_set1_ps(scale);
  for (int64_t r = 0; r < br; r += 2) {
    const bool pair = r + 1 < br;
    const __m512 D0 = _mm512_set1_ps(D[r]), D1 = _mm512_set1_ps(pair ? D[r + 1] : 0.0f);
    __m512 d0[4], d1[4];
    for (int v = 0; v < 4; ++v) {
      const int64_t c = 16 * v;
      const __mmask16 k0 = visible_columns(r, c, offset, bc), k1 = pair ? visible_columns(r + 1, c, offset, bc) : 0;
      const float *p0 = p + r * kB + c, *g0 = ds + r * kB + c;
      d0[v] = _mm512_maskz_mul_ps(k0, _mm512_mul_ps(sc, _mm512_maskz_loadu_ps(k0, p0)),
                                  _mm512_sub_ps(_mm512_maskz_loadu_ps(k0, g0), D0));
      d1[v] = _mm512_maskz_mul_ps(k1, _mm512_mul_ps(sc, _mm512_maskz_loadu_ps(k1, p0 + kB)),
                                  _mm512_sub_ps(_mm512_maskz_loadu_ps(k1, g0 + kB), D1));
      _mm512_storeu_si512(pk + r / 2 * kB + c, pair_words(d0[v], d1[v]));
    }
    float* row = ds + r * kB;
    _mm512_storeu_si512(row, (__m512i)_mm512_cvtne2ps_pbh(d0[1], d0[0]));
    _mm512_storeu_si512(row + 16, (__m512i)_mm512_cvtne2ps_pbh(d0[3], d0[2]));
    if (!pair) continue;
    _mm512_storeu_si512(row + kB, (__m512i)_mm512_cvtne2ps_pbh(d1[1], d1[0]));
    _mm512_storeu_si512(row + kB + 16, (__m512i)_mm512_cvtne2ps_pbh(d1[3], d1[2]));
  }
}

}  // namespace

// One kv head and its group of query heads, all of its key blocks, in flash_attention.cpp's
// backward_task order.
void bf16_backward_task(const Geometry& g, const bf16_t* dy, const bf16_t* qkv, const bf16_t* y, const float* lse,
                        bf16_t* dqkv, bool accumulate, int64_t bkv, float* ws) {
  const int64_t b = bkv / g.KV, j = bkv % g.KV, HS = g.HS, hp = pairs(HS), ld = g.W, T_ = g.T, G = g.G;
  const bf16_t* row0 = qkv + b * T_ * ld;
  const bf16_t *kbase = row0 + g.shape.k_col(j), *vbase = row0 + g.shape.v_col(j);
  auto dy_of = [&](int64_t i) { return dy + b * T_ * g.C + (j * G + i) * HS; };
  const int64_t d_stride = round_up(T_, 16), dq_stride = round_up(T_ * HS, 16);
  Carver carve(ws);
  float* D_all = carve.take(G * d_stride);
  float* dq_all = carve.take(G * dq_stride);
  uint32_t* kt = carve.take_words(hp * kB);      // K_j^T: [pair of d][key]
  uint32_t* vt = carve.take_words(hp * kB);      // V_j^T: [pair of d][key]
  uint32_t* kv = carve.take_words(kB / 2 * HS);  // K_j: [pair of keys][d]
  float* p = carve.take(kB * kB);                // s, then p: [query][key]
  float* ds = carve.take(kB * kB);               // dp, then ds (then its words in place)
  uint32_t* pk = carve.take_words(kB / 2 * kB);  // p, then ds: [pair of queries][key]
  float* dk = carve.take(kB * HS);
  float* dv = carve.take(kB * HS);
  uint32_t* qw = carve.take_words(kB * hp);       // Q_i: [query][pair of d]
  uint32_t* dow = carve.take_words(kB * hp);      // dO_i: [query][pair of d]
  uint32_t* qv = carve.take_words(kB / 2 * HS);   // Q_i: [pair of queries][d]
  uint32_t* dov = carve.take_words(kB / 2 * HS);  // dO_i: [pair of queries][d]
  MEMFIT_ASSERT(carve.used(ws) <= bf16_backward_floats(T_, HS, G), "flash backward scratch overrun");

  for (int64_t i = 0; i < G; ++i) row_dots(g, dy_of(i), y + b * T_ * g.C + (j * G + i) * HS, D_all + i * d_stride);
  std::fill(dq_all, dq_all + G * dq_stride, 0.0f);
  using enum TileCausal;
  for (int64_t kj = 0; kj < g.blocks; ++kj) {
    const int64_t k0 = kj * kB, bc = g.size(kj);
    transpose_words(kbase + k0 * ld, ld, bc, HS, kt, kB);
    transpose_words(vbase + k0 * ld, ld, bc, HS, vt, kB);
    interleave_rows(kbase + k0 * ld, ld, bc, HS, kv, HS);
    for (int64_t i = 0; i < G; ++i) {
      const bf16_t* qbase = row0 + g.shape.q_col(j * G + i);
      const bf16_t* dyb = dy_of(i);
      const float* lb = lse + (b * g.NH + j * G + i) * T_;
      const float* D = D_all + i * d_stride;
      float* dq = dq_all + i * dq_stride;
      for (int64_t qi = kj; qi < g.blocks; ++qi) {
        const int64_t q0 = qi * kB, br = g.size(qi);
        const bool first = i == 0 && qi == kj;  // the first product into this key block's dk, dv
        const bool diag = qi == kj;
        copy_words(qbase + q0 * ld, ld, br, HS, qw, hp);
        copy_words(dyb + q0 * g.C, g.C, br, HS, dow, hp);
        interleave_rows(qbase + q0 * ld, ld, br, HS, qv, HS);
        interleave_rows(dyb + q0 * g.C, g.C, br, HS, dov, HS);
        tile_dot_bf16(br, bc, hp, qw, hp, 1, kt, kB, p, kB, g.scale, false, diag ? cols_to_row : none);
        tile_probs(p, br, lb + q0, q0 - k0 + 1, bc, pk);
        tile_dot_bf16(bc, HS, pairs(br), pk, 1, kB, dov, HS, dv, HS, 1.0f, !first, diag ? k_from_row : none);
        tile_dot_bf16(br, bc, hp, dow, hp, 1, vt, kB, ds, kB, 1.0f, false, diag ? cols_to_row : none);
        tile_dscores(p, ds, br, D + q0, g.scale, q0 - k0 + 1, bc, pk);
        const uint32_t* dsw = reinterpret_cast<const uint32_t*>(ds);  // row r's words at ds + r kB
        tile_dot_bf16(br, HS, pairs(bc), dsw, kB, 1, kv, HS, dq + q0 * HS, HS, 1.0f, true, diag ? k_to_row : none);
        tile_dot_bf16(bc, HS, pairs(br), pk, 1, kB, qv, HS, dk, HS, 1.0f, !first, diag ? k_from_row : none);
      }
    }
    store_kv_grads(g, dqkv, b, j, k0, bc, dk, dv, accumulate);
  }
  store_q_grads(g, dqkv, b, j, dq_all, dq_stride, accumulate);
}

}  // namespace memfit::flash
#endif
