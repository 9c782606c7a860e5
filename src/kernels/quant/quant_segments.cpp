#include "kernels/quant/quant_segments.hpp"

#include <algorithm>

#include "core/error.hpp"
#include "core/half.hpp"
#include "kernels/quant/blockwise.hpp"

namespace memfit {

int64_t max_segment_blocks(const QuantSpec& spec, int64_t cols, const std::vector<int64_t>& segments) {
  int64_t most = 0;
  for (int64_t rows : segments) most = std::max(most, quant_blocks(rows * cols, spec.block));
  return most;
}

QuantStorage segment_offset(const QuantSpec& spec, int64_t cols, const std::vector<int64_t>& segments, size_t s) {
  MEMFIT_ASSERT(s < segments.size(), "segment {} of {}", s, segments.size());
  QuantStorage at;
  for (size_t i = 0; i < s; ++i) {
    const QuantStorage q = quant_storage(spec, segments[i] * cols);
    at.codes += q.codes, at.absmax += q.absmax, at.absmax2 += q.absmax2;
  }
  return at;
}

QuantizedWeight segment_weight(const QuantSpec& spec, int64_t cols, const std::vector<int64_t>& segments, size_t s,
                               const SegmentedStorage& st) {
  const QuantStorage at = segment_offset(spec, cols, segments, s);
  const uint64_t codes = at.codes, scales = at.absmax, scales2 = at.absmax2;
  const QuantStorage q = quant_storage(spec, segments[s] * cols);
  QuantizedWeight w;
  w.spec = spec;
  w.rows = segments[s];
  w.cols = cols;
  w.codes = {st.codes + codes, size_t(q.codes)};
  const auto* scale_bytes = static_cast<const uint8_t*>(st.scales) + scales;
  if (spec.double_quant) {
    w.absmax_codes = {scale_bytes, size_t(q.absmax)};
    w.absmax2 = {st.scales2 + scales2 / 4, size_t(q.absmax2 / 4)};
    w.offset = st.offset[s];
  } else {
    w.absmax = {reinterpret_cast<const float*>(scale_bytes), size_t(q.absmax / 4)};
  }
  return w;
}

template <class T>
void quantize_segments(std::span<const T> values, const QuantSpec& spec, int64_t cols,
                       const std::vector<int64_t>& segments, std::span<uint8_t> codes, std::span<uint8_t> scales,
                       std::span<float> scales2, std::span<float> offset, std::span<float> absmax_staging) {
  const QuantStorage total = segmented_quant_storage(spec, cols, segments);
  MEMFIT_CHECK(codes.size() == total.codes && scales.size() == total.absmax && scales2.size_bytes() == total.absmax2 &&
                   offset.size_bytes() == total.offset,
               "kernels", "segmented quantisation: storage spans do not match the weight's format");
  uint64_t e = 0, c = 0, a = 0, a2 = 0;
  for (size_t s = 0; s < segments.size(); ++s) {
    const int64_t n = segments[s] * cols;
    const QuantStorage q = quant_storage(spec, n);
    const std::span<const T> in = values.subspan(size_t(e), size_t(n));
    const std::span<uint8_t> out = codes.subspan(size_t(c), size_t(q.codes));
    const size_t blocks = size_t(quant_blocks(n, spec.block));
    if (spec.kind == QuantKind::int8) {
      quantize_int8<T>(in, spec, out, {reinterpret_cast<float*>(scales.data() + a), blocks});
    } else if (!spec.double_quant) {
      quantize_4bit<T>(in, spec, out, {reinterpret_cast<float*>(scales.data() + a), blocks});
    } else {
      MEMFIT_CHECK(absmax_staging.size() >= blocks, "kernels", "segmented quantisation: staging of {} blocks, need {}",
                   absmax_staging.size(), blocks);
      quantize_4bit<T>(in, spec, out, absmax_staging.first(blocks));
      offset[s] = double_quantize_absmax(absmax_staging.first(blocks), scales.subspan(size_t(a), blocks),
                                         scales2.subspan(size_t(a2 / 4), size_t(q.absmax2 / 4)));
    }
    e += uint64_t(n), c += q.codes, a += q.absmax, a2 += q.absmax2;
  }
}

template void quantize_segments<float>(std::span<const float>, const QuantSpec&, int64_t, const std::vector<int64_t>&,
                                       std::span<uint8_t>, std::span<uint8_t>, std::span<float>, std::span<float>,
                                       std::span<float>);
template void quantize_segments<bf16_t>(std::span<const bf16_t>, const QuantSpec&, int64_t,
                                        const std::vector<int64_t>&, std::span<uint8_t>, std::span<uint8_t>,
                                        std::span<float>, std::span<float>, std::span<float>);

}  // namespace memfit
