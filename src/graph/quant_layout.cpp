#include "graph/quant_layout.hpp"

#include <bit>

#include "core/error.hpp"

namespace memfit {

const char* quant_kind_name(QuantKind kind) {
  switch (kind) {
    case QuantKind::nf4: return "nf4";
    case QuantKind::fp4: return "fp4";
    case QuantKind::int8: return "int8";
  }
  return "?";
}

void check_quant_spec(const QuantSpec& spec) {
  MEMFIT_CHECK(spec.block >= kMinQuantBlock && spec.block <= kMaxQuantBlock && std::has_single_bit(uint64_t(spec.block)),
               "kernels", "quantisation block size {} is not supported: bitsandbytes takes 32, 64, 128, 256, 512, 1024, "
               "2048 or 4096", spec.block);
  MEMFIT_CHECK(!(spec.double_quant && spec.kind == QuantKind::int8), "kernels",
               "double quantisation applies to nf4 and fp4, not int8");
}

QuantStorage quant_storage(const QuantSpec& spec, int64_t numel) {
  check_quant_spec(spec);
  MEMFIT_CHECK(numel >= 0, "kernels", "a quantised tensor of {} elements", numel);
  const uint64_t n = uint64_t(numel), blocks = uint64_t(quant_blocks(numel, spec.block));
  QuantStorage s;
  s.codes = spec.kind == QuantKind::int8 ? n : (n + 1) / 2;
  if (spec.double_quant) {
    s.absmax = blocks;
    s.absmax2 = 4 * uint64_t(quant_blocks(int64_t(blocks), kDoubleQuantBlock));
    s.offset = 4;
  } else {
    s.absmax = 4 * blocks;
  }
  return s;
}

double quant_bits_per_parameter(const QuantSpec& spec) {
  check_quant_spec(spec);
  const double code_bits = spec.kind == QuantKind::int8 ? 8.0 : 4.0, block = double(spec.block);
  if (spec.double_quant) return code_bits + 8.0 / block + 32.0 / (block * double(kDoubleQuantBlock));
  return code_bits + 32.0 / block;
}

QuantStorage segmented_quant_storage(const QuantSpec& spec, int64_t cols, const std::vector<int64_t>& segments) {
  MEMFIT_CHECK(!segments.empty() && cols > 0, "kernels", "a segmented quantised weight needs segments and columns");
  QuantStorage total;
  for (int64_t rows : segments) {
    MEMFIT_CHECK(rows > 0, "kernels", "a quantised segment of {} rows", rows);
    MEMFIT_CHECK(spec.kind == QuantKind::int8 || (rows * cols) % 2 == 0, "kernels",
                 "a 4-bit segment of {} x {} elements (odd) cannot start the next one on a byte", rows, cols);
    const QuantStorage s = quant_storage(spec, rows * cols);
    total.codes += s.codes;
    total.absmax += s.absmax;
    total.absmax2 += s.absmax2;
    total.offset += s.offset;
  }
  return total;
}

}  // namespace memfit
