// DoRA's ops on the CPU (kernels/cpu/dora.hpp): dispatch on the big tensors' dtype; the
// per-column vectors are read in whatever float type they are stored.
#include <vector>

#include "kernels/cpu/cpu_prepare.hpp"
#include "kernels/cpu/dora.hpp"
#include "kernels/quant/quant_segments.hpp"

namespace memfit::cpu {

namespace {

// The blocks of a dora_scale(_backward) op: inputs [first, (m, norm) per block, (bias)].
std::vector<DoraBlock> blocks_of(const Program& p, const Op& op, const OpBinding& b, size_t first) {
  const DoraScaleAttrs& a = attrs_of<DoraScaleAttrs>(op);
  std::vector<DoraBlock> blocks(a.begins.size());
  for (size_t i = 0; i < blocks.size(); ++i) {
    DoraBlock& blk = blocks[i];
    blk.begin = a.begins[i], blk.width = a.widths[i];
    const size_t m = first + 2 * i;
    blk.m = {b.inputs[m], p.tensor(op.inputs[m]).dtype};
    blk.norm = {b.inputs[m + 1], p.tensor(op.inputs[m + 1]).dtype};
    if (op.kind == OpKind::dora_scale_backward) {
      blk.dm = b.outputs[1 + i];
      blk.dm_dtype = p.tensor(op.outputs[1 + i]).dtype;
    }
  }
  return blocks;
}

// The blocks of a dora_blend op (inputs [y0, (m, norm, p, q) per block], outputs [y, z per
// block]) or of its backward (inputs [dy, (m, norm, z) per block], outputs [(dp, dq, dm) per
// block]).
std::vector<DoraBlock> blend_blocks_of(const Program& p, const Op& op, const OpBinding& b) {
  const DoraScaleAttrs& a = attrs_of<DoraScaleAttrs>(op);
  const bool fwd = op.kind == OpKind::dora_blend;
  std::vector<DoraBlock> blocks(a.begins.size());
  for (size_t i = 0; i < blocks.size(); ++i) {
    DoraBlock& blk = blocks[i];
    blk.begin = a.begins[i], blk.width = a.widths[i];
    const size_t in = 1 + (fwd ? 4 : 3) * i;
    blk.m = {b.inputs[in], p.tensor(op.inputs[in]).dtype};
    blk.norm = {b.inputs[in + 1], p.tensor(op.inputs[in + 1]).dtype};
    if (fwd) {
      blk.p = b.inputs[in + 2], blk.q = b.inputs[in + 3], blk.z_out = b.outputs[1 + i];
    } else {
      blk.z = b.inputs[in + 2];
      blk.dp = b.outputs[3 * i], blk.dq = b.outputs[3 * i + 1], blk.dm = b.outputs[3 * i + 2];
      blk.dm_dtype = p.tensor(op.outputs[3 * i + 2]).dtype;
    }
  }
  return blocks;
}

Prepared prepare_dora_blend(const Program& p, const Op& op, const OpBinding& b) {
  const DoraScaleAttrs& a = attrs_of<DoraScaleAttrs>(op);
  const int64_t m = a.m, n = a.n;
  Prepared out;
  dispatch_t(op, dtype_of(p, op.inputs[0]), [&](auto t) {
    using T = decltype(t);
    if (op.kind == OpKind::dora_blend) {
      out = make_op([=, blocks = blend_blocks_of(p, op, b), y0 = in_t<T>(b, 0), y = out_t<T>(b, 0),
                     mode = op.modes[0]](const StepContext& ctx) {
        dora_blend_forward(y0, blocks, y, m, n, accumulates(mode, ctx));
      });
      return;
    }
    // The accumulate flags change with the micro-step; the closure's own copy is updated in place.
    out = make_op([=, blocks = blend_blocks_of(p, op, b), dy = in_t<T>(b, 0), modes = op.modes](
                      const StepContext& ctx) mutable {
      for (size_t i = 0; i < blocks.size(); ++i) {
        blocks[i].dp_accumulate = accumulates(modes[3 * i], ctx);
        blocks[i].dq_accumulate = accumulates(modes[3 * i + 1], ctx);
        blocks[i].dm_accumulate = accumulates(modes[3 * i + 2], ctx);
      }
      dora_blend_backward(dy, blocks, m, n);
    });
  });
  return out;
}

AnyFloats bias_of(const Program& p, const Op& op, const OpBinding& b) {
  if (!attrs_of<DoraScaleAttrs>(op).has_bias) return {};
  return {b.inputs.back(), p.tensor(op.inputs.back()).dtype};
}

}  // namespace

Prepared prepare_dora(const Program& p, const Op& op, const OpBinding& b) {
  Prepared out;
  if (op.kind == OpKind::dora_norm && attrs_of<DoraNormAttrs>(op).quantized) {
    const DoraNormAttrs a = attrs_of<DoraNormAttrs>(op);
    const size_t first = a.spec.double_quant ? 4 : 2;  // A, B after the storage
    const SegmentedStorage st{static_cast<const uint8_t*>(b.inputs[0]), b.inputs[1],
                              a.spec.double_quant ? static_cast<const float*>(b.inputs[2]) : nullptr,
                              a.spec.double_quant ? static_cast<const float*>(b.inputs[3]) : nullptr};
    dispatch_t(op, dtype_of(p, op.inputs[first]), [&](auto t) {
      using T = decltype(t);
      // The views are made when the op runs: the double-quantisation offsets are values, and
      // the storage is filled (initialised, loaded, resumed) after the program is prepared.
      std::vector<QuantizedWeight> pieces(a.segments.size());
      out = make_op([=, la = in_t<T>(b, first), lb = in_t<T>(b, first + 1), norm = out_f(b, 0)](
                        const StepContext&) mutable {
        for (size_t s = 0; s < pieces.size(); ++s) pieces[s] = segment_weight(a.spec, a.k, a.segments, s, st);
        dora_norm_rows_quantized<T>(pieces, a.weight_dtype, la, lb, norm, a.k, a.row_begin, a.rows, a.rank, a.scale);
      });
    });
    return out;
  }
  if (op.kind == OpKind::dora_norm) {
    const DoraNormAttrs a = attrs_of<DoraNormAttrs>(op);
    dispatch_t(op, dtype_of(p, op.inputs[0]), [&](auto t) {
      using T = decltype(t);
      out = make_op([=, w = in_t<T>(b, 0), la = in_t<T>(b, 1), lb = in_t<T>(b, 2), norm = out_f(b, 0)](
                        const StepContext&) { dora_norm_rows(w, la, lb, norm, a.k, a.row_begin, a.rows, a.rank, a.scale); });
    });
    return out;
  }
  if (op.kind == OpKind::dora_blend || op.kind == OpKind::dora_blend_backward) return prepare_dora_blend(p, op, b);
  const DoraScaleAttrs& a = attrs_of<DoraScaleAttrs>(op);
  const bool fwd = op.kind == OpKind::dora_scale;
  const AnyFloats bias = bias_of(p, op, b);
  const int64_t m = a.m, n = a.n;
  dispatch_t(op, dtype_of(p, op.outputs[0]), [&](auto t) {
    using T = decltype(t);
    if (fwd) {
      out = make_op([=, blocks = blocks_of(p, op, b, 1), z = in_t<T>(b, 0), y = out_t<T>(b, 0), mode = op.modes[0]](
                        const StepContext& ctx) { dora_scale_forward(z, blocks, bias, y, m, n, accumulates(mode, ctx)); });
      return;
    }
    // The accumulate flags change with the micro-step; the closure's own copy is updated in place.
    // A trained bias's gradient is the output after the magnitudes'.
    BiasGradient db;
    if (op.outputs.size() == 2 + a.begins.size()) db = {b.outputs.back(), p.tensor(op.outputs.back()).dtype, false};
    out = make_op([=, blocks = blocks_of(p, op, b, 2), dy = in_t<T>(b, 0), z = in_t<T>(b, 1), dz = out_t<T>(b, 0),
                   modes = op.modes](const StepContext& ctx) mutable {
      for (size_t i = 0; i < blocks.size(); ++i) blocks[i].dm_accumulate = accumulates(modes[1 + i], ctx);
      db.accumulate = accumulates(modes.back(), ctx);
      dora_scale_backward(dy, z, blocks, bias, dz, m, n, accumulates(modes[0], ctx), db);
    });
  });
  return out;
}

}  // namespace memfit::cpu
