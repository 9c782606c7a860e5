// 8-bit blockwise AdamW. Per block of (at most) `block` elements, in one pass over the
// parameter, the gradient and the codes: dequantize m and v (code value x block absmax),
// update them in fp32 exactly as the fp32 AdamW does (adamw.cpp, same operations in the same
// order), update the parameter from these unquantized moments, and keep them in a stack
// buffer; then requantize the block with its new absmax. Blocks are independent, so threads
// split the flattened list of blocks of all tensors.
//
// Subtle point: an all-zero block (the padded vocabulary rows never get a gradient) has
// absmax 0; its codes are the map's zero code (1 / absmax is taken as 0, never inf, which
// would make 0 * inf = NaN codes).
#include "kernels/cpu/avx512_quiet.hpp"  // first: before any intrinsics header
#include "kernels/cpu/adamw8bit.hpp"

#include <algorithm>
#include <cmath>

#include "core/error.hpp"
#include "core/half.hpp"
#include "kernels/cpu/parallel.hpp"
#include "kernels/cpu/widen16.hpp"
#include "kernels/cpu/quant_codec.hpp"

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace memfit {
namespace {

constexpr int64_t kMaxBlock = 2048;

struct Step {
  float b1, b2, one_b1, one_b2, step_size, inv_sqrt_bc2, eps, decay, grad_scale;
};

template <class G>
void update_block(const AdamW8bitTensor& t, int64_t block_index, int64_t block, const Step& c) {
  const QuantCodec& mq = signed_codec();
  const QuantCodec& vq = unsigned_codec();
  const int64_t begin = block_index * block, end = std::min(t.numel, begin + block), n = end - begin;
  float* p = t.param + begin;
  const G* g = static_cast<const G*>(t.grad) + begin;
  uint8_t* mc = t.m + begin;
  uint8_t* vc = t.v + begin;
  const float m_scale = t.m_absmax[block_index], v_scale = t.v_absmax[block_index];
  alignas(64) float m[kMaxBlock];
  alignas(64) float v[kMaxBlock];
  float m_max = 0, v_max = 0;
  int64_t i = 0;
#if defined(__AVX512F__)
  {
    const __m512 b1 = _mm512_set1_ps(c.b1), b2 = _mm512_set1_ps(c.b2), one_b1 = _mm512_set1_ps(c.one_b1);
    const __m512 one_b2 = _mm512_set1_ps(c.one_b2), step = _mm512_set1_ps(c.step_size);
    const __m512 inv_bc2 = _mm512_set1_ps(c.inv_sqrt_bc2), eps = _mm512_set1_ps(c.eps);
    const __m512 decay = _mm512_set1_ps(c.decay), gs = _mm512_set1_ps(c.grad_scale);
    const __m512 ms = _mm512_set1_ps(m_scale), vs = _mm512_set1_ps(v_scale);
    __m512 m_max16 = _mm512_setzero_ps(), v_max16 = _mm512_setzero_ps();
    for (; i + 16 <= n; i += 16) {
      const __m512 ge = _mm512_mul_ps(widen16(g + i), gs);
      const __m512 m_old = _mm512_mul_ps(mq.decode16(mc + i), ms);
      const __m512 v_old = _mm512_mul_ps(vq.decode16(vc + i), vs);
      const __m512 me = _mm512_add_ps(_mm512_mul_ps(b1, m_old), _mm512_mul_ps(one_b1, ge));
      const __m512 ve = _mm512_add_ps(_mm512_mul_ps(b2, v_old), _mm512_mul_ps(_mm512_mul_ps(one_b2, ge), ge));
      const __m512 root = _mm512_maskz_sqrt_ps(__mmask16(0xFFFF), ve);  // see adamw.cpp on _mm512_sqrt_ps
      const __m512 denom = _mm512_add_ps(_mm512_mul_ps(root, inv_bc2), eps);
      const __m512 pe =
          _mm512_sub_ps(_mm512_mul_ps(_mm512_loadu_ps(p + i), decay), _mm512_div_ps(_mm512_mul_ps(step, me), denom));
      _mm512_storeu_ps(p + i, pe);
      _mm512_store_ps(m + i, me);
      _mm512_store_ps(v + i, ve);
      m_max16 = _mm512_max_ps(m_max16, _mm512_abs_ps(me));
      v_max16 = _mm512_max_ps(v_max16, ve);
    }
    m_max = _mm512_reduce_max_ps(m_max16);
    v_max = _mm512_reduce_max_ps(v_max16);
  }
#endif
  for (; i < n; ++i) {
    const float ge = widen(g[i]) * c.grad_scale;
    const float me = c.b1 * (mq.decode(mc[i]) * m_scale) + c.one_b1 * ge;
    const float ve = c.b2 * (vq.decode(vc[i]) * v_scale) + c.one_b2 * ge * ge;
    p[i] = p[i] * c.decay - c.step_size * me / (std::sqrt(ve) * c.inv_sqrt_bc2 + c.eps);
    m[i] = me;
    v[i] = ve;
    m_max = std::max(m_max, std::fabs(me));
    v_max = std::max(v_max, ve);
  }
  t.m_absmax[block_index] = m_max;
  t.v_absmax[block_index] = v_max;
  const float m_inv = m_max > 0 ? 1.0f / m_max : 0.0f, v_inv = v_max > 0 ? 1.0f / v_max : 0.0f;
  i = 0;
#if defined(__AVX512F__)
  {
    const __m512 mi = _mm512_set1_ps(m_inv), vi = _mm512_set1_ps(v_inv);
    for (; i + 16 <= n; i += 16) {
      _mm_storeu_si128(reinterpret_cast<__m128i*>(mc + i), mq.encode16(_mm512_mul_ps(_mm512_load_ps(m + i), mi)));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(vc + i), vq.encode16(_mm512_mul_ps(_mm512_load_ps(v + i), vi)));
    }
  }
#endif
  for (; i < n; ++i) {
    mc[i] = mq.encode(m[i] * m_inv);
    vc[i] = vq.encode(v[i] * v_inv);
  }
}

}  // namespace

AdamW8bitSet::AdamW8bitSet(std::vector<AdamW8bitTensor> tensors, int64_t block, DType grad_dtype)
    : tensors_(std::move(tensors)), block_(block), grad_dtype_(grad_dtype) {
  MEMFIT_CHECK(block >= 1 && block <= kMaxBlock, "kernels", "adamw8bit: block size {} outside [1, {}]", block,
               kMaxBlock);
  MEMFIT_CHECK(grad_dtype == DType::f32 || grad_dtype == DType::bf16 || grad_dtype == DType::f16, "kernels",
               "adamw8bit: no CPU kernel for {} gradients", dtype_name(grad_dtype));
  block_offsets_.assign(tensors_.size() + 1, 0);
  for (size_t i = 0; i < tensors_.size(); ++i)
    block_offsets_[i + 1] = block_offsets_[i] + (tensors_[i].numel + block - 1) / block;
  (void)signed_codec(), (void)unsigned_codec();  // built here, at prepare time, not in a step
}

void AdamW8bitSet::run(const AdamWHyper& h) const {
  const double bc1 = 1.0 - std::pow(double(h.beta1), double(h.step));
  const double bc2 = 1.0 - std::pow(double(h.beta2), double(h.step));
  const Step base{float(h.beta1),     float(h.beta2),           float(1.0 - h.beta1), float(1.0 - h.beta2),
                  float(h.lr / bc1), float(1.0 / std::sqrt(bc2)), float(h.eps),        1.0f,
                  h.grad_scale};
  const double lr = h.lr;
  const AdamW8bitTensor* tensors = tensors_.data();
  const int64_t* offsets = block_offsets_.data();
  const int64_t count = int64_t(tensors_.size()), block = block_;
  auto pass = [&](auto grad_type) {
    using G = decltype(grad_type);
    parallel_for(blocks(), std::max<int64_t>(1, kParallelGrain / block), [=](int64_t lo, int64_t hi) {
      int64_t i = std::upper_bound(offsets, offsets + count + 1, lo) - offsets - 1;
      for (int64_t b = lo; b < hi; ++b) {
        while (b >= offsets[i + 1]) ++i;
        Step c = base;
        c.decay = float(1.0 - lr * double(tensors[i].weight_decay));
        update_block<G>(tensors[i], b - offsets[i], block, c);
      }
    });
  };
  switch (grad_dtype_) {
    case DType::bf16: return pass(bf16_t{});
    case DType::f16: return pass(fp16_t{});
    default: return pass(float{});
  }
}

}  // namespace memfit
