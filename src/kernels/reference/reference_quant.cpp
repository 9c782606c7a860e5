#include "kernels/reference/reference_quant.hpp"

#include <algorithm>
#include <vector>

#include "kernels/closure_op.hpp"
#include "kernels/quant/blockwise.hpp"
#include "kernels/quant/quant_segments.hpp"

namespace memfit::ref {

std::unique_ptr<PreparedOp> prepare_quant_linear(const Program& p, const Op& op, const OpBinding& b) {
  (void)p;
  const QuantLinearAttrs a = std::get<QuantLinearAttrs>(op.attrs);
  const bool forward = op.kind == OpKind::quant_linear;
  const QuantSpec& spec = a.spec;
  const SegmentedStorage st{static_cast<const uint8_t*>(b.inputs[1]), b.inputs[2],
                            a.spec.double_quant ? static_cast<const float*>(b.inputs[3]) : nullptr,
                            a.spec.double_quant ? static_cast<const float*>(b.inputs[4]) : nullptr};
  std::vector<QuantizedWeight> weights;
  std::vector<size_t> stored;  // each multiplied piece's index in the storage
  for (size_t s = 0; s < a.segments.size(); ++s) {
    if (a.piece >= 0 && s != size_t(a.piece)) continue;
    weights.push_back(segment_weight(spec, a.k, a.segments, s, st));
    stored.push_back(s);
  }
  const float* in = static_cast<const float*>(b.inputs[0]);
  const float* bias = forward && a.has_bias ? static_cast<const float*>(b.inputs.back()) : nullptr;
  float* out = static_cast<float*>(b.outputs[0]);
  float* tile = static_cast<float*>(b.workspace[0]);
  const WriteMode mode = op.modes[0];
  // The double-quantisation offset is a value read when the op runs: the storage is only
  // filled (initialised, loaded, resumed) after the program is prepared.
  return make_op([=](const StepContext& ctx) mutable {
    if (a.spec.double_quant)
      for (size_t s = 0; s < weights.size(); ++s) weights[s].offset = st.offset[stored[s]];
    const int64_t M = a.m, N = a.n, K = a.k;
    if (!forward && !accumulates(mode, ctx)) std::fill(out, out + M * K, 0.0f);
    int64_t row = 0;
    for (size_t s = 0; s < weights.size(); ++s) {
      const QuantizedWeight& w = weights[s];
      for (int64_t t = 0; t < w.rows; t += a.tile_rows) {
        const int64_t h = std::min(a.tile_rows, w.rows - t);
        dequantize_range<float>(w, t * K, (t + h) * K, std::span<float>(tile, size_t(h * K)));
        round_to_weight_dtype(a.weight_dtype, std::span<float>(tile, size_t(h * K)));
        const int64_t r0 = row + t;
        for (int64_t i = 0; i < M; ++i) {
          if (forward) {
            for (int64_t r = 0; r < h; ++r) {
              double sum = bias ? double(bias[r0 + r]) : 0.0;
              for (int64_t k = 0; k < K; ++k) sum += double(in[i * K + k]) * double(tile[r * K + k]);
              out[i * N + r0 + r] = float(sum);
            }
          } else {
            for (int64_t k = 0; k < K; ++k) {
              double sum = 0.0;
              for (int64_t r = 0; r < h; ++r) sum += double(in[i * N + r0 + r]) * double(tile[r * K + k]);
              out[i * K + k] += float(sum);
            }
          }
        }
      }
      row += w.rows;
    }
  });
}

}  // namespace memfit::ref
