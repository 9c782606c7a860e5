#include "train/quantized_weights.hpp"

#include <vector>

#include "core/error.hpp"
#include "graph/quantize_base.hpp"
#include "kernels/quant/blockwise.hpp"
#include "kernels/quant/quant_segments.hpp"

namespace memfit {

bool is_quantized_param(const ParamEntry& e) { return e.value == kNoTensor && e.stored(ParamRole::codes) != kNoTensor; }

void store_quantized_parameter(Executor& ex, const ParamEntry& e, std::span<const float> values) {
  const Program& p = ex.program();
  const QuantizedParam qp = quantized_param_of(p, e);
  MEMFIT_CHECK(qp.codes != kNoTensor, "train", "parameter '{}' is not stored quantised", e.name);
  MEMFIT_CHECK(int64_t(values.size()) == qp.rows * qp.cols, "train", "parameter '{}': {} values for a [{}, {}] weight",
               e.name, values.size(), qp.rows, qp.cols);
  const QuantSpec spec = quant_spec_of(qp);
  const QuantStorage s = segmented_quant_storage(spec, qp.cols, qp.segments);
  std::vector<uint8_t> codes(s.codes), scales(s.absmax);
  std::vector<float> scales2(s.absmax2 / 4), offset(s.offset / 4);
  std::vector<float> staging(spec.double_quant ? size_t(max_segment_blocks(spec, qp.cols, qp.segments)) : 0);
  if (qp.compute == DType::bf16) {
    std::vector<bf16_t> rounded(values.size());
    for (size_t i = 0; i < values.size(); ++i) rounded[i] = round_to_bf16(values[i]);
    quantize_segments<bf16_t>(rounded, spec, qp.cols, qp.segments, codes, scales, scales2, offset, staging);
  } else {
    MEMFIT_CHECK(qp.compute == DType::f32, "train", "quantised weights compute in fp32 or bf16, not {}",
                 dtype_name(qp.compute));
    quantize_segments<float>(values, spec, qp.cols, qp.segments, codes, scales, scales2, offset, staging);
  }
  ex.write(qp.codes, std::as_bytes(std::span<const uint8_t>(codes)));
  ex.write(qp.scales, std::as_bytes(std::span<const uint8_t>(scales)));
  if (spec.double_quant) {
    ex.write(qp.scales2, std::as_bytes(std::span<const float>(scales2)));
    ex.write(qp.offset, std::as_bytes(std::span<const float>(offset)));
  }
}

}  // namespace memfit
