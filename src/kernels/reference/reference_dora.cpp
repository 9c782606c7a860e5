#include "kernels/reference/reference_dora.hpp"

#include <cmath>
#include <vector>

#include "kernels/closure_op.hpp"
#include "kernels/op_contract.hpp"
#include "kernels/quant/blockwise.hpp"
#include "kernels/quant/quant_segments.hpp"

namespace memfit::ref {

namespace {

const float* in(const OpBinding& b, size_t i) { return static_cast<const float*>(b.inputs[i]); }
float* out(const OpBinding& b, size_t j) { return static_cast<float*>(b.outputs[j]); }

// ||W[row] + scale (B A)[j]||, with (B A)[j, c] = sum_r B[j, r] A[r, c] in double; row(j)
// gives W's row row_begin + j.
template <class Row>
void norm_rows(const Row& row, const float* a, const float* b, float* norm, const DoraNormAttrs& at) {
  for (int64_t j = 0; j < at.rows; ++j) {
    const float* w = row(j);
    double sum = 0;
    for (int64_t c = 0; c < at.k; ++c) {
      double ba = 0;
      for (int64_t r = 0; r < at.rank; ++r) ba += double(b[j * at.rank + r]) * double(a[r * at.k + c]);
      const double v = double(w[c]) + double(at.scale) * ba;
      sum += v * v;
    }
    norm[j] = float(std::sqrt(sum));
  }
}

// The factor m / norm of column c, or 1 outside every block; the block's index in `block`.
double factor(const OpBinding& b, const DoraScaleAttrs& a, size_t first, int64_t c, int* block) {
  for (size_t i = 0; i < a.begins.size(); ++i)
    if (c >= a.begins[i] && c < a.begins[i] + a.widths[i]) {
      *block = int(i);
      const int64_t j = c - a.begins[i];
      return double(in(b, first + 2 * i)[j]) / double(in(b, first + 2 * i + 1)[j]);
    }
  *block = -1;
  return 1.0;
}

// dora_blend(_backward), element by element in double: the forward's block i has inputs m,
// norm, p, q at 1 + 4 i and output z at 1 + i; the backward's has inputs m, norm, z at 1 + 3 i
// and outputs dp, dq, dm at 3 i.
std::unique_ptr<PreparedOp> prepare_blend(const Op& op, const OpBinding& b) {
  const DoraScaleAttrs a = attrs_of<DoraScaleAttrs>(op);
  const bool fwd = op.kind == OpKind::dora_blend;
  const std::vector<WriteMode> modes = op.modes;
  return make_op([=](const StepContext& ctx) {
    auto put = [&](float* o, double v, size_t output) {
      if (o) *o = accumulates(modes[output], ctx) ? float(*o + v) : float(v);  // null: not wanted
    };
    auto at = [&](size_t output, int64_t i) { return b.outputs[output] ? out(b, output) + i : nullptr; };
    const float* first = in(b, 0);  // y0 or dy
    if (fwd)
      for (int64_t i = 0; i < a.m * a.n; ++i) put(at(0, i), double(first[i]), 0);
    for (size_t blk = 0; blk < a.begins.size(); ++blk) {
      const size_t base = 1 + (fwd ? 4 : 3) * blk;
      const float *m = in(b, base), *norm = in(b, base + 1);
      const int64_t w = a.widths[blk];
      for (int64_t j = 0; j < w; ++j) {
        const double f = double(m[j]) / double(norm[j]);
        double dm = 0;
        for (int64_t r = 0; r < a.m; ++r) {
          const int64_t e = r * w + j;
          if (fwd) {
            const double pv = double(in(b, base + 2)[e]), qv = double(in(b, base + 3)[e]);
            float& y = out(b, 0)[r * a.n + a.begins[blk] + j];
            y = float(double(y) + (f - 1.0) * pv + f * qv);
            out(b, 1 + blk)[e] = float(pv + qv);
            continue;
          }
          const double g = double(first[r * a.n + a.begins[blk] + j]);
          put(at(3 * blk, e), g * (f - 1.0), 3 * blk);
          put(at(3 * blk + 1, e), g * f, 3 * blk + 1);
          dm += g * double(in(b, base + 2)[e]);
        }
        if (!fwd) put(at(3 * blk + 2, j), dm / double(norm[j]), 3 * blk + 2);
      }
    }
  });
}

}  // namespace

std::unique_ptr<PreparedOp> prepare_dora(const Program&, const Op& op, const OpBinding& b) {
  if (op.kind == OpKind::dora_norm && attrs_of<DoraNormAttrs>(op).quantized) {
    // fp32 runs only here: the dequantised rows are fp32 (weight_dtype f32), as quant_linear's.
    const DoraNormAttrs a = attrs_of<DoraNormAttrs>(op);
    const size_t first = a.spec.double_quant ? 4 : 2;
    const SegmentedStorage st{static_cast<const uint8_t*>(b.inputs[0]), b.inputs[1],
                              a.spec.double_quant ? static_cast<const float*>(b.inputs[2]) : nullptr,
                              a.spec.double_quant ? static_cast<const float*>(b.inputs[3]) : nullptr};
    return make_op([=](const StepContext&) {
      std::vector<float> w(size_t(a.k));
      norm_rows([&](int64_t j) {
        size_t s = 0;
        int64_t local = a.row_begin + j;
        while (local >= a.segments[s]) local -= a.segments[s++];
        dequantize_range<float>(segment_weight(a.spec, a.k, a.segments, s, st), local * a.k, (local + 1) * a.k, w);
        return w.data();
      }, in(b, first), in(b, first + 1), out(b, 0), a);
    });
  }
  if (op.kind == OpKind::dora_norm) {
    const DoraNormAttrs a = attrs_of<DoraNormAttrs>(op);
    const float* w = in(b, 0);
    return make_op([=](const StepContext&) {
      norm_rows([&](int64_t j) { return w + (a.row_begin + j) * a.k; }, in(b, 1), in(b, 2), out(b, 0), a);
    });
  }
  if (op.kind == OpKind::dora_blend || op.kind == OpKind::dora_blend_backward) return prepare_blend(op, b);
  const DoraScaleAttrs a = attrs_of<DoraScaleAttrs>(op);
  const bool fwd = op.kind == OpKind::dora_scale;
  const std::vector<WriteMode> modes = op.modes;
  const size_t op_outputs = op.outputs.size();
  return make_op([=](const StepContext& ctx) {
    const size_t first = fwd ? 1 : 2;
    const float* bias = a.has_bias ? static_cast<const float*>(b.inputs.back()) : nullptr;
    const float* z = in(b, fwd ? 0 : 1);
    const float* dy = fwd ? nullptr : in(b, 0);
    float* y = out(b, 0);
    const bool acc = accumulates(modes[0], ctx);
    if (!fwd && op_outputs == 2 + a.begins.size()) {  // a trained bias: dy (1 - m / norm) in the blocks
      float* db = out(b, op_outputs - 1);
      const bool db_acc = accumulates(modes.back(), ctx);
      for (int64_t c = 0; c < a.n; ++c) {
        int block = -1;
        const double f = factor(b, a, first, c, &block);
        double sum = 0;
        for (int64_t r = 0; block >= 0 && r < a.m; ++r) sum += double(dy[r * a.n + c]) * (1.0 - f);
        db[c] = db_acc ? float(double(db[c]) + sum) : float(sum);
      }
    }
    if (!fwd) {  // dm before dz: dz may overwrite dy
      for (size_t i = 0; i < a.begins.size(); ++i)
        for (int64_t j = 0; j < a.widths[i]; ++j) {
          const int64_t c = a.begins[i] + j;
          double sum = 0;
          for (int64_t r = 0; r < a.m; ++r)
            sum += double(dy[r * a.n + c]) * (double(z[r * a.n + c]) - (bias ? double(bias[c]) : 0.0));
          const float g = float(sum / double(in(b, first + 2 * i + 1)[j]));
          float& dm = out(b, 1 + i)[j];
          dm = accumulates(modes[1 + i], ctx) ? dm + g : g;
        }
    }
    for (int64_t r = 0; r < a.m; ++r)
      for (int64_t c = 0; c < a.n; ++c) {
        int block = -1;
        const double f = factor(b, a, first, c, &block);
        const double bc = bias && block >= 0 ? double(bias[c]) : 0.0;
        const double v = fwd ? (double(z[r * a.n + c]) - bc) * f + bc : double(dy[r * a.n + c]) * f;
        float& o = y[r * a.n + c];
        o = acc ? float(double(o) + v) : float(v);
      }
  });
}

}  // namespace memfit::ref
