// matmul through sgemm or oneDNN (see matmul.hpp). The one subtle point: a oneDNN product
// whose mode switches between overwrite and accumulate across micro-steps
// (accumulate_after_first_micro) gets both primitives at prepare time, because building one
// at run time would allocate; sgemm takes the mode as an argument.
#include "kernels/cpu/matmul.hpp"

#include <omp.h>

#include <algorithm>

#include "core/error.hpp"
#include "kernels/cpu/transpose.hpp"

namespace memfit {
dnnl::memory::data_type dnnl_type(DType t) {
  switch (t) {
    case DType::f32: return dnnl::memory::data_type::f32;
    case DType::bf16: return dnnl::memory::data_type::bf16;
    case DType::f16: return dnnl::memory::data_type::f16;
    default: throw Error("kernels", fmt::format("no oneDNN product over {} operands", dtype_name(t)));
  }
}

DnnlMatmulSpec matmul_spec(const MatmulAttrs& a, bool has_bias, bool accumulate, const MatmulTypes& t) {
  DnnlMatmulSpec s;
  s.src = dnnl_matrix(a.m, a.k, a.trans_a, dnnl_type(t.a));
  s.wei = dnnl_matrix(a.k, a.n, a.trans_b, dnnl_type(t.b));
  s.dst = dnnl_matrix(a.m, a.n, false, dnnl_type(t.c));
  s.bias = has_bias;
  s.bias_dt = dnnl_type(t.bias);
  s.scale = a.alpha;
  s.accumulate = accumulate;
  return s;
}

bool runs_sgemm(const MatmulAttrs& a, const MatmulTypes& t) {
  return t.a == DType::f32 && t.b == DType::f32 && t.bias == DType::f32 && t.c == DType::f32 && !a.trans_a &&
         !a.trans_b;
}

bool stages_b(const MatmulAttrs& a, const MatmulTypes& t) {
  return t.b == DType::f32 && !a.trans_b && a.n >= kStageBMinN && !runs_sgemm(a, t);
}

namespace {
SgemmShape sgemm_shape(const MatmulAttrs& a) { return SgemmShape{a.m, a.n, a.k, a.alpha}; }
// The attributes oneDNN sees: a staged B is read transposed from the scratch.
MatmulAttrs as_run(MatmulAttrs a, const MatmulTypes& t) {
  if (stages_b(a, t)) a.trans_b = true;
  return a;
}
uint64_t staged_bytes(const MatmulAttrs& a, const MatmulTypes& t) {
  return stages_b(a, t) ? (uint64_t(a.k) * uint64_t(a.n) * sizeof(float) + 63) / 64 * 64 : 0;
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

MatmulKernel::MatmulKernel(const DnnlEnv& env, const MatmulAttrs& attrs, bool has_bias, WriteVariants variants,
                           const MatmulTypes& types) {
  MEMFIT_CHECK(attrs.m > 0 && attrs.n > 0 && attrs.k > 0, "kernels", "matmul with empty shape m={} n={} k={}", attrs.m,
               attrs.n, attrs.k);
  if (runs_skinny_bf16(attrs, types.a, types.b, types.c, has_bias)) {
    skinny_ = true, c_bf16_ = types.c == DType::bf16, attrs_ = attrs;
    return;
  }
  if (runs_sgemm(attrs, types)) {
    sgemm_ = true;
    sgemm_shape_ = sgemm_shape(attrs);
    threads_ = omp_get_max_threads();
    return;
  }
  const MatmulAttrs r = as_run(attrs, types);
  if (variants.overwrite) overwrite_ = DnnlMatmul(env, matmul_spec(r, has_bias, false, types));
  if (variants.accumulate) accumulate_ = DnnlMatmul(env, matmul_spec(r, has_bias, true, types));
  if (stages_b(attrs, types)) k_ = attrs.k, n_ = attrs.n;
}

uint64_t MatmulKernel::scratch_bytes(const DnnlEnv& env, const MatmulAttrs& attrs, bool has_bias,
                                     WriteVariants variants, const MatmulTypes& types) {
  if (runs_skinny_bf16(attrs, types.a, types.b, types.c, has_bias)) return skinny_bf16_scratch_bytes(attrs);
  if (runs_sgemm(attrs, types))
    return sgemm_scratch_bytes(sgemm_shape(attrs), omp_get_max_threads());
  const MatmulAttrs r = as_run(attrs, types);
  uint64_t bytes = 0;
  if (variants.overwrite)
    bytes = std::max(bytes, DnnlMatmul::scratch_bytes(env, matmul_spec(r, has_bias, false, types)));
  if (variants.accumulate)
    bytes = std::max(bytes, DnnlMatmul::scratch_bytes(env, matmul_spec(r, has_bias, true, types)));
  return staged_bytes(attrs, types) + bytes;
}

void MatmulKernel::bind(const void* a, const void* b, const void* bias, void* c, void* scratch) {
  if (skinny_) {
    skinny_a_ = static_cast<const uint16_t*>(a), skinny_b_ = static_cast<const uint16_t*>(b);
    skinny_c_ = c, scratch_ = scratch;
    return;
  }
  if (sgemm_) {
    a_ = static_cast<const float*>(a), b_ = static_cast<const float*>(b), bias_ = static_cast<const float*>(bias);
    c_ = static_cast<float*>(c), scratch_ = scratch;
    return;
  }
  if (k_ > 0) {
    b_ = static_cast<const float*>(b);
    staged_b_ = static_cast<float*>(scratch);
    b = staged_b_;
    scratch = static_cast<char*>(scratch) + (uint64_t(k_) * uint64_t(n_) * sizeof(float) + 63) / 64 * 64;
  }
  if (overwrite_.valid()) overwrite_.bind(a, b, bias, c, scratch);
  if (accumulate_.valid()) accumulate_.bind(a, b, bias, c, scratch);
}

void MatmulKernel::run(bool accumulate) const {
  if (skinny_) {
    skinny_bf16_matmul(attrs_, skinny_a_, skinny_b_, skinny_c_, c_bf16_, accumulate, scratch_);
    return;
  }
  if (sgemm_) {
    sgemm(sgemm_shape_, a_, b_, bias_, c_, accumulate, scratch_, threads_);
    return;
  }
  const DnnlMatmul& prim = accumulate ? accumulate_ : overwrite_;
  MEMFIT_ASSERT(prim.valid(), "matmul prepared without its {} variant", accumulate ? "accumulate" : "overwrite");
  if (staged_b_) transpose(staged_b_, b_, k_, n_);
  prim.execute();
}

}  // namespace memfit
