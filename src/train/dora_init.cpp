#include "train/dora_init.hpp"

#include <cmath>
#include <map>
#include <set>
#include <vector>

#include "core/error.hpp"
#include "kernels/cpu/dora.hpp"
#include "train/master_weights.hpp"
#include "train/weights.hpp"

namespace memfit {

namespace {

const ParamEntry& param_with_value(const Program& p, TensorId value, const std::string& what) {
  for (const ParamEntry& e : p.params())
    if (e.value == value) return e;
  throw Error("train", fmt::format("DoRA: {} '{}' is no parameter stored whole (a quantised base weight?): its "
                                   "magnitudes cannot start as ||W + scale B A||: not supported",
                                   what, p.tensor(value).name));
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
    if (op.kind != OpKind::dora_scale || op.phase != Phase::forward) continue;
    const auto& a = std::get<DoraScaleAttrs>(op.attrs);
    for (size_t i = 0; i < a.begins.size(); ++i) magnitude_of_norm[op.inputs[2 + 2 * i]] = op.inputs[1 + 2 * i];
  }
  std::set<TensorId> done;
  for (const Op& op : p.ops()) {
    if (op.kind != OpKind::dora_norm || op.phase != Phase::forward) continue;  // not a recomputed copy
    const auto it = magnitude_of_norm.find(op.outputs[0]);
    MEMFIT_ASSERT(it != magnitude_of_norm.end(), "DoRA norm {} feeds no dora_scale", op.name);
    if (!done.insert(it->second).second) continue;  // an evaluation section's copy of the op
    const auto& a = std::get<DoraNormAttrs>(op.attrs);
    const ParamEntry& w = param_with_value(p, op.inputs[0], "base weight");
    const std::vector<float> la = values_of(ex, param_with_value(p, op.inputs[1], "adapter"), staging);
    const std::vector<float> lb = values_of(ex, param_with_value(p, op.inputs[2], "adapter"), staging);
    std::vector<float> norms(size_t(a.rows));
    // W's rows a staging chunk at a time: a whole weight in fp32 would add its size to the
    // process's peak at start-up.
    const std::span<float> chunk = staging.values();
    const int64_t per_chunk = std::max<int64_t>(1, int64_t(chunk.size()) / a.k);
    MEMFIT_CHECK(int64_t(chunk.size()) >= a.k, "train", "DoRA: a row of {} elements exceeds the staging", a.k);
    for (int64_t r0 = 0; r0 < a.rows; r0 += per_chunk) {
      const int64_t h = std::min(per_chunk, a.rows - r0);
      const std::span<float> rows = chunk.first(size_t(h * a.k));
      load_parameter_range(ex, w, (a.row_begin + r0) * a.k, rows, staging);
      for (int64_t j = 0; j < h; ++j)
        norms[size_t(r0 + j)] = float(std::sqrt(dora_row_sum_of_squares(
            rows.data() + j * a.k, la.data(), lb.data() + (r0 + j) * a.rank, a.k, a.rank, a.scale)));
    }
    const ParamEntry* m = nullptr;
    for (const ParamEntry& e : p.params())
      if (e.value == it->second) m = &e;
    MEMFIT_ASSERT(m != nullptr, "DoRA magnitude of {} is no parameter", op.name);
    store_one_rank_range(ex, *m, 0, norms, staging);
  }
}

}  // namespace memfit
