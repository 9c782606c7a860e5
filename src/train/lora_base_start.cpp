#include "train/lora_base_start.hpp"

#include <algorithm>

#include "core/error.hpp"
#include "graph/lora.hpp"
#include "train/lora_start_factors.hpp"
#include "train/master_weights.hpp"
#include "train/quantized_weights.hpp"
#include "train/rng.hpp"
#include "train/weights.hpp"

namespace memfit {

namespace {

const ParamEntry& param_named(const Program& p, const std::string& name) {
  for (const ParamEntry& e : p.params())
    if (e.name == name) return e;
  MEMFIT_ASSERT(false, "no parameter {}", name);
  return p.params().front();
}

bool is_pissa(const LoraPolicy& lora) { return lora.init == LoraInit::pissa; }

int64_t chunk_rows(int64_t cols) { return std::max<int64_t>(1, int64_t(TensorStaging::kElements) / cols); }

}  // namespace

bool rewrites_base(const LoraPolicy& lora) {
  return lora.rank > 0 && (lora.init == LoraInit::olora || lora.init == LoraInit::pissa);
}

uint64_t pissa_seed(uint64_t seed, const std::string& module) { return derive_seed(seed, module + ".pissa"); }

void start_adapters_from_base(Executor& ex, const LoraPolicy& lora, uint64_t seed, TensorStaging& staging) {
  if (!rewrites_base(lora)) return;
  const Program& p = ex.program();
  const char* init = is_pissa(lora) ? "PiSSA" : "OLoRA";
  for (const LinearModule& m : lora_targets(p, lora)) {
    const ParamEntry& w = param_named(p, m.weight);
    MEMFIT_CHECK(!is_quantized_param(w), "lora",
                 "{} (init_lora_weights) on a quantised base ({}): not supported; start the adapters on the float "
                 "base and quantise its residual (memfit merge-lora of the started adapter), as PEFT advises",
                 init, m.weight);
    const bool sharded = !w.storage_shard.empty() ||
                         p.tensor(p.root_of(w.value)).category == Category::communication;
    MEMFIT_CHECK(!sharded, "lora",
                 "{} with ZeRO-3: the adapters start from the whole weight {}, which no rank holds; start at --zero "
                 "0, 1 or 2 and resume its checkpoint (--resume takes any layout) at ZeRO-3", init, m.weight);
    const std::string path = lora_module_path(p, m.name);
    const double scale = lora.scale_of(path);
    const FactorShape shape{m.rows, m.cols, lora.rank_of(path), chunk_rows(m.cols)};
    const WeightRows read = [&](int64_t first, int64_t count, std::span<float> out) {
      load_parameter_range(ex, w, (m.row_begin + first) * m.cols, out.first(size_t(count * m.cols)), staging);
    };
    const LowRankFactors f = is_pissa(lora)
                                 ? pissa_factors(shape, scale, lora.pissa_niter, pissa_seed(seed, m.name), read, m.name)
                                 : olora_factors(shape, read);
    store_one_rank_range(ex, param_named(p, lora_a_name(m.name)), 0, f.a, staging);
    store_one_rank_range(ex, param_named(p, lora_b_name(m.name)), 0, f.b, staging);
    const std::span<float> chunk = staging.values();
    for (int64_t r0 = 0; r0 < m.rows; r0 += shape.chunk_rows) {
      const int64_t h = std::min(shape.chunk_rows, m.rows - r0);
      const std::span<float> rows = chunk.first(size_t(h * m.cols));
      read(r0, h, rows);
      subtract_low_rank(rows, r0, h, m.cols, f, scale);
      store_parameter_range(ex, w, (m.row_begin + r0) * m.cols, rows, staging);
    }
  }
}

uint64_t base_start_scratch_bytes(const Program& p, const LoraPolicy& lora) {
  if (!rewrites_base(lora)) return 0;
  uint64_t most = 0;
  for (const LinearModule& m : lora_targets(p, lora)) {
    const int64_t rank = lora.rank_of(lora_module_path(p, m.name));
    const uint64_t chunk = uint64_t(chunk_rows(m.cols) * m.cols) * sizeof(float);
    most = std::max(most, chunk + factor_scratch_bytes(m.rows, m.cols, rank, is_pissa(lora), lora.pissa_niter));
  }
  return most;
}

}  // namespace memfit
