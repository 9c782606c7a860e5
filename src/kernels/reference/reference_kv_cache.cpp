#include "kernels/reference/reference_kv_cache.hpp"

#include <cmath>
#include <vector>

#include "core/error.hpp"
#include "kernels/reference/reference_llama.hpp"

namespace memfit::ref {
namespace {

// One token's qkv row rotated as the rope reference rotates the row at `position` of a sequence.
template <class F>
std::vector<F> rotated_row(const F* row, int64_t width, int64_t position, const AttentionAttrs& a, int64_t kv) {
  std::vector<F> seq(size_t((position + 1) * width), F(0)), out(seq.size());
  for (int64_t c = 0; c < width; ++c) seq[size_t(position * width + c)] = row[c];
  rope_forward(seq.data(), out.data(), 1, position + 1, a.heads, kv, a.head_dim, double(a.rope_theta), a.rope_scaling);
  return {out.begin() + position * width, out.end()};
}

}  // namespace

template <class F>
void embedding_at(const int32_t* tokens, const F* wte, const F* wpe, F* x, int64_t B, int64_t T, int64_t C,
                  int64_t position) {
  for (int64_t n = 0; n < B * T; ++n)
    for (int64_t c = 0; c < C; ++c) {
      const double e = double(wte[int64_t(tokens[n]) * C + c]);
      x[n * C + c] = F(wpe ? e + double(wpe[(position + n % T) * C + c]) : e);
    }
}

template <class F>
void cached_attention(const F* qkv, F* y, F* k_cache, F* v_cache, const CachedAttentionAttrs& attrs, bool rope,
                      int64_t position) {
  const AttentionAttrs& a = attrs.attn;
  const int64_t B = a.batch, T = a.seq, NH = a.heads, HS = a.head_dim, S = attrs.capacity;
  const int64_t KV = a.kv_heads > 0 ? a.kv_heads : NH, width = (NH + 2 * KV) * HS;
  MEMFIT_CHECK(position >= 0 && position + T <= S, "kernels", "cached attention: positions beyond the cache");
  std::vector<std::vector<F>> rows(size_t(B * T));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t) {
      const F* r = qkv + (b * T + t) * width;
      auto& rr = rows[size_t(b * T + t)];
      rr = rope ? rotated_row(r, width, position + t, a, KV) : std::vector<F>(r, r + width);
      for (int64_t g = 0; g < KV; ++g)
        for (int64_t i = 0; i < HS; ++i) {
          const int64_t at = ((b * KV + g) * S + position + t) * HS + i;
          k_cache[at] = rr[size_t((NH + g) * HS + i)];
          v_cache[at] = rr[size_t((NH + KV + g) * HS + i)];
        }
    }
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < NH; ++h)
      for (int64_t t = 0; t < T; ++t) {
        const int64_t g = h / (NH / KV), last = position + t;
        const F* q = rows[size_t(b * T + t)].data() + h * HS;
        std::vector<double> s(size_t(last + 1));
        double mx = -INFINITY, sum = 0;
        for (int64_t j = 0; j <= last; ++j) {
          double d = 0;
          for (int64_t i = 0; i < HS; ++i) d += double(q[i]) * double(k_cache[((b * KV + g) * S + j) * HS + i]);
          s[size_t(j)] = d * double(a.scale);
          mx = std::max(mx, s[size_t(j)]);
        }
        for (double& v : s) sum += (v = std::exp(v - mx));
        for (int64_t i = 0; i < HS; ++i) {
          double acc = 0;
          for (int64_t j = 0; j <= last; ++j) acc += s[size_t(j)] * double(v_cache[((b * KV + g) * S + j) * HS + i]);
          y[(b * T + t) * NH * HS + h * HS + i] = F(acc / sum);
        }
      }
}

template void embedding_at<float>(const int32_t*, const float*, const float*, float*, int64_t, int64_t, int64_t,
                                  int64_t);
template void cached_attention<float>(const float*, float*, float*, float*, const CachedAttentionAttrs&, bool, int64_t);

}  // namespace memfit::ref
