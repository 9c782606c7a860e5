// matmul through oneDNN (see matmul.hpp). The one subtle point: a mode that switches between
// overwrite and accumulate across micro-steps (accumulate_after_first_micro) gets both
// primitives at prepare time, because building one at run time would allocate.
#include "kernels/cpu/matmul.hpp"

#include <algorithm>

#include "core/error.hpp"

namespace memfit {
DnnlMatmulSpec matmul_spec(const MatmulAttrs& a, bool has_bias, bool accumulate) {
  DnnlMatmulSpec s;
  s.src = dnnl_matrix(a.m, a.k, a.trans_a);
  s.wei = dnnl_matrix(a.k, a.n, a.trans_b);
  s.dst = dnnl_matrix(a.m, a.n, false);
  s.bias = has_bias;
  s.scale = a.alpha;
  s.accumulate = accumulate;
  return s;
}

WriteVariants WriteVariants::of(WriteMode mode) {
  switch (mode) {
    case WriteMode::overwrite: return {true, false};
    case WriteMode::accumulate:
    case WriteMode::update: return {false, true};
    case WriteMode::accumulate_after_first_micro: return {true, true};
  }
  return {true, true};
}

MatmulKernel::MatmulKernel(const DnnlEnv& env, const MatmulAttrs& attrs, bool has_bias, WriteVariants variants) {
  MEMFIT_CHECK(attrs.m > 0 && attrs.n > 0 && attrs.k > 0, "kernels", "matmul with empty shape m={} n={} k={}", attrs.m,
               attrs.n, attrs.k);
  if (variants.overwrite) overwrite_ = DnnlMatmul(env, matmul_spec(attrs, has_bias, false));
  if (variants.accumulate) accumulate_ = DnnlMatmul(env, matmul_spec(attrs, has_bias, true));
}

uint64_t MatmulKernel::scratch_bytes(const DnnlEnv& env, const MatmulAttrs& attrs, bool has_bias,
                                     WriteVariants variants) {
  uint64_t bytes = 0;
  if (variants.overwrite) bytes = std::max(bytes, DnnlMatmul::scratch_bytes(env, matmul_spec(attrs, has_bias, false)));
  if (variants.accumulate) bytes = std::max(bytes, DnnlMatmul::scratch_bytes(env, matmul_spec(attrs, has_bias, true)));
  return bytes;
}

void MatmulKernel::bind(const float* a, const float* b, const float* bias, float* c, void* scratch) {
  if (overwrite_.valid()) overwrite_.bind(a, b, bias, c, scratch);
  if (accumulate_.valid()) accumulate_.bind(a, b, bias, c, scratch);
}

void MatmulKernel::run(bool accumulate) const {
  const DnnlMatmul& prim = accumulate ? accumulate_ : overwrite_;
  MEMFIT_ASSERT(prim.valid(), "matmul prepared without its {} variant", accumulate ? "accumulate" : "overwrite");
  prim.execute();
}

}  // namespace memfit
