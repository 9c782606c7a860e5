#include "io/float_convert.hpp"

#include <bit>
#include <cstring>

#include "core/error.hpp"
#include "core/half.hpp"

namespace memfit {

static_assert(std::endian::native == std::endian::little, "memfit io reads little-endian files in place");

namespace {

template <class T>
void widen_run(const std::byte* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    T x;
    std::memcpy(&x, src + int64_t(sizeof(T)) * i, sizeof(T));
    dst[i] = widen(x);
  }
}

}  // namespace

void widen_to_f32(DType from, const std::byte* src, float* dst, int64_t n) {
  switch (from) {
    case DType::f32: std::memcpy(dst, src, size_t(n) * sizeof(float)); return;
    case DType::bf16: widen_run<bf16_t>(src, dst, n); return;
    case DType::f16: widen_run<fp16_t>(src, dst, n); return;
    default: MEMFIT_ASSERT(false, "widen_to_f32 from non-float dtype {}", dtype_name(from));
  }
}

}  // namespace memfit
