// Element types. Sizes are in bits so that packed 4-bit formats (nf4) have exact byte counts:
// a tensor of n nf4 elements takes ceil(n/2) bytes.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace memfit {

enum class DType : uint8_t { f32, bf16, f16, i32, i8, u8, nf4 };

inline constexpr DType kAllDTypes[] = {DType::f32, DType::bf16, DType::f16, DType::i32,
                                       DType::i8,  DType::u8,   DType::nf4};

int dtype_bits(DType t);
std::string_view dtype_name(DType t);
DType parse_dtype(std::string_view name);  // throws [dtype] on unknown names
bool dtype_is_float(DType t);
// Exact storage bytes, packed formats rounded up; throws [size] on a negative count or overflow.
uint64_t dtype_bytes(DType t, int64_t numel);

}  // namespace memfit
