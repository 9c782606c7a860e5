// The op contract of DoRA's kinds (see op_contract.hpp): dora_norm over a float or a
// quantised W, dora_scale and its backward, dora_blend and its backward.
#include "kernels/op_contract.hpp"
#include "kernels/quant/quant_segments.hpp"

namespace memfit {

namespace {

bool is_float(DType t) { return t == DType::f32 || t == DType::bf16 || t == DType::f16; }

// QDoRA: W's storage as its quant_linear reads it (format, pieces), A and B of one float type.
void check_dora_quantized(const Program& p, const Op& op) {
  const DoraNormAttrs& a = std::get<DoraNormAttrs>(op.attrs);
  const size_t storage = a.spec.double_quant ? 4 : 2;
  check_arity(op, storage + 2, 1);
  int64_t n = 0;
  for (int64_t r : a.segments) n += r;
  MEMFIT_CHECK(!a.segments.empty() && a.k > 0 && a.rank > 0 && a.rows > 0 && a.row_begin >= 0 &&
                   a.row_begin + a.rows <= n,
               "kernels", "op '{}': rows [{}, {}) of a quantised weight of {} rows", op.name, a.row_begin,
               a.row_begin + a.rows, n);
  MEMFIT_CHECK(a.weight_dtype == DType::f32 || a.weight_dtype == DType::bf16 || a.weight_dtype == DType::f16,
               "kernels", "op '{}': dequantised weights rounded to {}", op.name, dtype_name(a.weight_dtype));
  const QuantStorage q = segmented_quant_storage(a.spec, a.k, a.segments);
  const uint64_t want[] = {q.codes, q.absmax, q.absmax2, q.offset};
  for (size_t i = 0; i < storage; ++i)
    MEMFIT_CHECK(p.tensor(op.inputs[i]).bytes() == want[i], "kernels", "op '{}': '{}' has {} bytes, the format needs {}",
                 op.name, p.tensor(op.inputs[i]).name, p.tensor(op.inputs[i]).bytes(), want[i]);
  require_dtype(p, op, op.inputs[1], a.spec.double_quant ? DType::u8 : DType::f32);
  const DType t = p.tensor(op.inputs[storage]).dtype;
  MEMFIT_CHECK(is_float(t), "kernels", "op '{}': the adapter is {}", op.name, dtype_name(t));
  check_numel(p, op, op.inputs[storage], a.rank * a.k, "A");
  check_numel(p, op, op.inputs[storage + 1], a.rows * a.rank, "B");
  require_dtype(p, op, op.inputs[storage + 1], t);
  check_numel(p, op, op.outputs[0], a.rows, "norm");
  require_dtype(p, op, op.outputs[0], DType::f32);
  require_overwrite(op, 0);
}

// The sorted, disjoint column blocks of a dora_scale or dora_blend over n columns.
void check_blocks(const Op& op, const DoraScaleAttrs& a) {
  MEMFIT_CHECK(!a.begins.empty() && a.widths.size() == a.begins.size(), "kernels",
               "op '{}': {} block starts and {} widths", op.name, a.begins.size(), a.widths.size());
  for (size_t i = 0, end = 0; i < a.begins.size(); ++i) {
    MEMFIT_CHECK(a.widths[i] > 0 && a.begins[i] >= int64_t(end) && a.begins[i] + a.widths[i] <= a.n, "kernels",
                 "op '{}': column block [{}, {}) overlaps another or lies outside {} columns", op.name, a.begins[i],
                 a.begins[i] + a.widths[i], a.n);
    end = size_t(a.begins[i] + a.widths[i]);
  }
}

// dora_blend: in [y0, (m, norm, p, q) per block] out [y, z per block]; backward in [dy, (m,
// norm, z) per block] out [(dp, dq, dm) per block]. p, q, z and their gradients are the block's
// columns.
void check_dora_blend(const Program& p, const Op& op) {
  const bool fwd = op.kind == OpKind::dora_blend;
  const DoraScaleAttrs& a = std::get<DoraScaleAttrs>(op.attrs);
  check_blocks(op, a);
  MEMFIT_CHECK(!a.has_bias, "kernels", "op '{}': a blend takes no bias (y0 holds it)", op.name);
  const size_t blocks = a.begins.size(), stride = fwd ? 4 : 3;
  check_arity(op, 1 + stride * blocks, fwd ? 1 + blocks : 3 * blocks);
  const DType dt = p.tensor(op.inputs[0]).dtype;
  check_numel(p, op, op.inputs[0], a.m * a.n, fwd ? "y0" : "dy");
  if (fwd) {
    check_numel(p, op, op.outputs[0], a.m * a.n, "y");
    require_dtype(p, op, op.outputs[0], dt);
  }
  auto block_tensor = [&](TensorId id, int64_t width, const char* what) {
    check_numel(p, op, id, a.m * width, what);
    require_dtype(p, op, id, dt);
  };
  for (size_t i = 0; i < blocks; ++i) {
    const size_t in = 1 + stride * i;
    check_numel(p, op, op.inputs[in], a.widths[i], "magnitude");
    check_numel(p, op, op.inputs[in + 1], a.widths[i], "norm");
    require_dtype(p, op, op.inputs[in + 1], DType::f32);
    if (fwd) {
      block_tensor(op.inputs[in + 2], a.widths[i], "p");
      block_tensor(op.inputs[in + 3], a.widths[i], "q");
      block_tensor(op.outputs[1 + i], a.widths[i], "z");
      require_overwrite(op, 1 + i);
      continue;
    }
    block_tensor(op.inputs[in + 2], a.widths[i], "z");
    block_tensor(op.outputs[3 * i], a.widths[i], "dp");
    block_tensor(op.outputs[3 * i + 1], a.widths[i], "dq");
    check_numel(p, op, op.outputs[3 * i + 2], a.widths[i], "magnitude gradient");
  }
}

}  // namespace

// DoRA: dora_norm reads W's adapted rows with A and B of W's dtype; dora_scale(_backward)'s
// blocks are sorted, disjoint column ranges of z, each with its magnitude and fp32 norm.
void check_dora(const Program& p, const Op& op) {
  if (op.kind == OpKind::dora_norm && std::get<DoraNormAttrs>(op.attrs).quantized) return check_dora_quantized(p, op);
  if (op.kind == OpKind::dora_norm) {
    check_arity(op, 3, 1);
    const DoraNormAttrs a = std::get<DoraNormAttrs>(op.attrs);
    MEMFIT_CHECK(a.k > 0 && a.rank > 0 && a.rows > 0 && a.row_begin >= 0 &&
                     p.tensor(op.inputs[0]).numel() >= (a.row_begin + a.rows) * a.k,
                 "kernels", "op '{}': rows [{}, {}) of a weight of {} elements with {} columns", op.name, a.row_begin,
                 a.row_begin + a.rows, p.tensor(op.inputs[0]).numel(), a.k);
    MEMFIT_CHECK(p.tensor(op.inputs[0]).numel() % a.k == 0, "kernels", "op '{}': W is not {} columns wide", op.name,
                 a.k);
    check_numel(p, op, op.inputs[1], a.rank * a.k, "A");
    check_numel(p, op, op.inputs[2], a.rows * a.rank, "B");
    check_numel(p, op, op.outputs[0], a.rows, "norm");
    for (TensorId id : {op.inputs[1], op.inputs[2]}) require_dtype(p, op, id, p.tensor(op.inputs[0]).dtype);
    require_dtype(p, op, op.outputs[0], DType::f32);
    require_overwrite(op, 0);
    return;
  }
  if (op.kind == OpKind::dora_blend || op.kind == OpKind::dora_blend_backward) return check_dora_blend(p, op);
  const bool fwd = op.kind == OpKind::dora_scale;
  const DoraScaleAttrs& a = std::get<DoraScaleAttrs>(op.attrs);
  const size_t blocks = a.begins.size(), first = fwd ? 1 : 2;
  check_blocks(op, a);
  // The backward's last output, when there is one more, is a trained bias's gradient.
  const bool db = !fwd && a.has_bias && op.outputs.size() == 2 + blocks;
  check_arity(op, first + 2 * blocks + (a.has_bias ? 1 : 0), fwd ? 1 : 1 + blocks + (db ? 1 : 0));
  const DType dt = p.tensor(op.outputs[0]).dtype;
  for (size_t i = 0; i < first; ++i) {
    check_numel(p, op, op.inputs[i], a.m * a.n, i == 0 && !fwd ? "dy" : "z");
    require_dtype(p, op, op.inputs[i], dt);
  }
  check_numel(p, op, op.outputs[0], a.m * a.n, fwd ? "y" : "dz");
  for (size_t i = 0; i < blocks; ++i) {
    check_numel(p, op, op.inputs[first + 2 * i], a.widths[i], "magnitude");
    check_numel(p, op, op.inputs[first + 2 * i + 1], a.widths[i], "norm");
    require_dtype(p, op, op.inputs[first + 2 * i + 1], DType::f32);
    if (!fwd) check_numel(p, op, op.outputs[1 + i], a.widths[i], "magnitude gradient");
  }
  if (a.has_bias) check_numel(p, op, op.inputs.back(), a.n, "bias");
  if (db) check_numel(p, op, op.outputs.back(), a.n, "bias gradient");
}

}  // namespace memfit
