// matmul through oneDNN (see matmul.hpp). The one subtle point: a mode that switches between
// overwrite and accumulate across micro-steps (accumulate_after_first_micro) gets both
// primitives at prepare time, because building one at run time would allocate.
#include "kernels/cpu/matmul.hpp"

#include <algorithm>

#include "core/error.hpp"
#include "kernels/cpu/transpose.hpp"

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

bool stages_b(const MatmulAttrs& a) { return !a.trans_b && a.n >= kStageBMinN; }

namespace {
// The attributes oneDNN sees: a staged B is read transposed from the scratch.
MatmulAttrs as_run(MatmulAttrs a) {
  if (stages_b(a)) a.trans_b = true;
  return a;
}
uint64_t staged_bytes(const MatmulAttrs& a) {
  return stages_b(a) ? (uint64_t(a.k) * uint64_t(a.n) * sizeof(float) + 63) / 64 * 64 : 0;
}
}  // namespace

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
  if (variants.overwrite) overwrite_ = DnnlMatmul(env, matmul_spec(as_run(attrs), has_bias, false));
  if (variants.accumulate) accumulate_ = DnnlMatmul(env, matmul_spec(as_run(attrs), has_bias, true));
  if (stages_b(attrs)) k_ = attrs.k, n_ = attrs.n;
}

uint64_t MatmulKernel::scratch_bytes(const DnnlEnv& env, const MatmulAttrs& attrs, bool has_bias,
                                     WriteVariants variants) {
  const MatmulAttrs r = as_run(attrs);
  uint64_t bytes = 0;
  if (variants.overwrite) bytes = std::max(bytes, DnnlMatmul::scratch_bytes(env, matmul_spec(r, has_bias, false)));
  if (variants.accumulate) bytes = std::max(bytes, DnnlMatmul::scratch_bytes(env, matmul_spec(r, has_bias, true)));
  return staged_bytes(attrs) + bytes;
}

void MatmulKernel::bind(const float* a, const float* b, const float* bias, float* c, void* scratch) {
  if (k_ > 0) {
    b_ = b;
    staged_b_ = static_cast<float*>(scratch);
    b = staged_b_;
    scratch = static_cast<char*>(scratch) + (uint64_t(k_) * uint64_t(n_) * sizeof(float) + 63) / 64 * 64;
  }
  if (overwrite_.valid()) overwrite_.bind(a, b, bias, c, scratch);
  if (accumulate_.valid()) accumulate_.bind(a, b, bias, c, scratch);
}

void MatmulKernel::run(bool accumulate) const {
  const DnnlMatmul& prim = accumulate ? accumulate_ : overwrite_;
  MEMFIT_ASSERT(prim.valid(), "matmul prepared without its {} variant", accumulate ? "accumulate" : "overwrite");
  if (staged_b_) transpose(staged_b_, b_, k_, n_);
  prim.execute();
}

}  // namespace memfit
