#include "train/dora_init.hpp"

#include <map>
#include <set>
#include <vector>

#include "core/error.hpp"
#include "kernels/cpu/dora.hpp"
#include "train/master_weights.hpp"
#include "train/quantized_weights.hpp"
#include "train/weights.hpp"

namespace memfit {

namespace {

const ParamEntry& param_with_value(const Program& p, TensorId value) {
  for (const ParamEntry& e : p.params())
    if (e.value == value) return e;
  MEMFIT_ASSERT(false, "DoRA reads {}, which is no parameter", p.tensor(value).name);
  return p.params().front();
}

const ParamEntry& param_with_codes(const Program& p, TensorId codes) {
  for (const ParamEntry& e : p.params())
    if (e.stored(ParamRole::codes) == codes) return e;
  MEMFIT_ASSERT(false, "DoRA reads {}, which is no quantised parameter", p.tensor(codes).name);
  return p.params().front();
}

// The norms of rows [row_begin, row_begin + rows) of W + scale B A, by the step's own kernel on
// W's rows read as the step reads them: a chunk of them at a time, never the whole weight.
void row_norms(const Executor& ex, const Op& op, const std::vector<float>& la, const std::vector<float>& lb,
               std::vector<float>& norms, TensorStaging& staging) {
  const Program& p = ex.program();
  const auto& a = std::get<DoraNormAttrs>(op.attrs);
  auto add_rows = [&](int64_t first, int64_t rows, std::span<const float> w) {  // first: relative to row_begin
    dora_norm_rows<float>(w.data(), la.data(), lb.data() + first * a.rank, norms.data() + first, a.k, 0, rows, a.rank,
                          a.scale);
  };
  if (a.quantized) {
    // A DoRA branch covers whole pieces of W (a fused q/k/v weight's pieces are its modules).
    size_t s = 0;
    for (int64_t r = 0; r < a.row_begin; ++s) r += a.segments[s];
    MEMFIT_ASSERT(s < a.segments.size() && a.segments[s] == a.rows, "{} covers no whole piece", op.name);
    read_dequantized_rows(ex, param_with_codes(p, op.inputs[0]), s, add_rows, staging);
    return;
  }
  const ParamEntry& w = param_with_value(p, op.inputs[0]);
  const std::span<float> chunk = staging.values();
  const int64_t per_chunk = int64_t(chunk.size()) / a.k;
  MEMFIT_CHECK(per_chunk >= 1, "train", "DoRA: a row of {} elements exceeds the staging", a.k);
  for (int64_t r0 = 0; r0 < a.rows; r0 += per_chunk) {
    const int64_t h = std::min(per_chunk, a.rows - r0);
    const std::span<float> rows = chunk.first(size_t(h * a.k));
    load_parameter_range(ex, w, (a.row_begin + r0) * a.k, rows, staging);
    add_rows(r0, h, rows);
  }
}

std::vector<float> values_of(const Executor& ex, const ParamEntry& e, TensorStaging& staging) {
  std::vector<float> v(size_t(ex.program().tensor(e.value).numel()));
  load_parameter_range(ex, e, 0, v, staging);
  return v;
}

}  // namespace

void initialize_dora_magnitudes(Executor& ex, TensorStaging& staging) {
  const Program& p = ex.program();
  std::map<TensorId, TensorId> magnitude_of_norm;
  for (const Op& op : p.ops()) {
    if ((op.kind != OpKind::dora_scale && op.kind != OpKind::dora_blend) || op.phase != Phase::forward) continue;
    const auto& a = std::get<DoraScaleAttrs>(op.attrs);
    const size_t stride = op.kind == OpKind::dora_blend ? 4 : 2;  // (m, norm, p, q) or (m, norm) per block
    for (size_t i = 0; i < a.begins.size(); ++i) magnitude_of_norm[op.inputs[2 + stride * i]] = op.inputs[1 + stride * i];
  }
  std::set<TensorId> done;
  for (const Op& op : p.ops()) {
    if (op.kind != OpKind::dora_norm || op.phase != Phase::forward) continue;  // not a recomputed copy
    const auto it = magnitude_of_norm.find(op.outputs[0]);
    MEMFIT_ASSERT(it != magnitude_of_norm.end(), "DoRA norm {} feeds no dora_scale", op.name);
    if (!done.insert(it->second).second) continue;  // an evaluation section's copy of the op
    const auto& a = std::get<DoraNormAttrs>(op.attrs);
    const size_t first = a.quantized ? (a.spec.double_quant ? 4 : 2) : 1;  // A, B
    const ParamEntry& w = a.quantized ? param_with_codes(p, op.inputs[0]) : param_with_value(p, op.inputs[0]);
    const bool sharded = !w.storage_shard.empty() || (w.value != kNoTensor &&
                                                      p.tensor(p.root_of(w.value)).category == Category::communication) ||
                         p.tensor(p.root_of(op.inputs[first])).category == Category::communication;
    MEMFIT_CHECK(!sharded, "train", "DoRA with ZeRO-3: the magnitudes start as ||W + scale B A||, which needs whole rows "
                 "of W on one rank; load them with --load-adapter (a PEFT DoRA adapter), or train at --zero 0, 1 or 2");
    const std::vector<float> la = values_of(ex, param_with_value(p, op.inputs[first]), staging);
    const std::vector<float> lb = values_of(ex, param_with_value(p, op.inputs[first + 1]), staging);
    std::vector<float> norms(size_t(a.rows));
    row_norms(ex, op, la, lb, norms, staging);
    store_one_rank_range(ex, param_with_value(p, it->second), 0, norms, staging);
  }
}

}  // namespace memfit
