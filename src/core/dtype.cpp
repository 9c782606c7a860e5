#include "core/dtype.hpp"

#include "core/checked.hpp"
#include "core/error.hpp"

namespace memfit {

int dtype_bits(DType t) {
  switch (t) {
    case DType::f32: return 32;
    case DType::bf16: return 16;
    case DType::f16: return 16;
    case DType::i32: return 32;
    case DType::i8: return 8;
    case DType::u8: return 8;
    case DType::nf4: return 4;
  }
  MEMFIT_ASSERT(false, "unknown dtype {}", int(t));
}

std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "fp32";
    case DType::bf16: return "bf16";
    case DType::f16: return "fp16";
    case DType::i32: return "int32";
    case DType::i8: return "int8";
    case DType::u8: return "uint8";
    case DType::nf4: return "nf4";
  }
  MEMFIT_ASSERT(false, "unknown dtype {}", int(t));
}

DType parse_dtype(std::string_view name) {
  for (DType t : kAllDTypes)
    if (dtype_name(t) == name) return t;
  if (name == "float32" || name == "f32") return DType::f32;
  if (name == "float16" || name == "f16") return DType::f16;
  if (name == "bfloat16") return DType::bf16;
  throw Error("dtype", fmt::format("unknown dtype '{}' (expected fp32, bf16, fp16, int32, int8, uint8, nf4)", name));
}

bool dtype_is_float(DType t) { return t == DType::f32 || t == DType::bf16 || t == DType::f16; }

uint64_t dtype_bytes(DType t, int64_t numel) {
  // Whole bytes of each group of 8 elements, then the tail: no intermediate count of bits that
  // could overflow while the byte count itself fits.
  const uint64_t n = checked_unsigned(numel, "element count"), bits = uint64_t(dtype_bits(t));
  constexpr std::string_view what = "bytes of a tensor's elements";
  return checked_add(checked_mul(n / 8, bits, what), ((n % 8) * bits + 7) / 8, what);
}

}  // namespace memfit
