#include "train/lora_base_start.hpp"

#include <algorithm>
#include <memory>

#include "core/error.hpp"
#include "core/half.hpp"
#include "graph/lora.hpp"
#include "graph/quantize_base.hpp"
#include "train/lora_start_factors.hpp"
#include "train/master_weights.hpp"
#include "train/rng.hpp"
#include "train/weights.hpp"

namespace memfit {

namespace {

const ParamEntry& param_named(const Program& p, const std::string& name) {
  const ParamEntry* e = p.find_param(name);
  MEMFIT_ASSERT(e != nullptr, "no parameter {}", name);
  return *e;
}

// A weight's values as a model in its compute dtype holds them (PEFT starts from the bf16 model).
void round_to_weight_dtype(std::span<float> values, DType dtype) {
  if (dtype == DType::bf16)
    for (float& v : values) v = widen(narrow<bf16_t>(v));
  else if (dtype == DType::f16)
    for (float& v : values) v = widen(narrow<fp16_t>(v));
}

int64_t chunk_rows(int64_t cols) { return std::max<int64_t>(1, int64_t(TensorStaging::kElements) / cols); }

const char* init_title(const LoraPolicy& lora) { return lora.init == LoraInit::pissa ? "PiSSA" : "OLoRA"; }

}  // namespace

BaseStart::Started BaseStart::start_module(Executor& ex, const LinearModule& m, const WeightRows& read,
                                           TensorStaging& staging) {
  const Program& p = ex.program();
  const std::string path = lora_module_path(p, m.name);
  Started st;
  st.scale = lora_.scale_of(path);
  const FactorShape shape{m.rows, m.cols, lora_.rank_of(path), chunk_rows(m.cols)};
  const uint64_t drawn_from = lora_.start_seed >= 0 ? uint64_t(lora_.start_seed) : seed_;
  st.f = lora_.init == LoraInit::pissa
             ? pissa_factors(shape, st.scale, lora_.pissa_niter, pissa_seed(drawn_from, m.name), read, m.name)
             : olora_factors(shape, read);
  store_one_rank_range(ex, param_named(p, lora_a_name(m.name)), 0, st.f.a, staging);
  store_one_rank_range(ex, param_named(p, lora_b_name(m.name)), 0, st.f.b, staging);
  stored_.insert({lora_a_name(m.name), lora_b_name(m.name)});
  return st;
}

bool rewrites_base(const LoraPolicy& lora) {
  return lora.rank > 0 && (lora.init == LoraInit::olora || lora.init == LoraInit::pissa);
}

uint64_t pissa_seed(uint64_t seed, const std::string& module) { return derive_seed(seed, module + ".pissa"); }

SegmentValues BaseStart::quantized_values(Executor& ex, const ParamEntry& e, SegmentValues values,
                                          TensorStaging& staging) {
  if (!rewrites_base(lora_)) return values;
  const Program& p = ex.program();
  const QuantizedParam qp = quantized_param_of(p, e);
  auto started = std::make_shared<std::vector<Started>>();
  for (const LinearModule& m : lora_targets(p, lora_)) {
    if (m.weight != e.name) continue;
    // A target is a whole piece: llama's q, k or v of the fused weight, or the weight itself.
    size_t s = 0;
    for (int64_t r = 0; r < m.row_begin && s < qp.segments.size(); ++s) r += qp.segments[s];
    MEMFIT_ASSERT(s < qp.segments.size() && qp.segments[s] == m.rows, "{} is no piece of {}", m.name, e.name);
    // The values as the run's weights hold them before quantising (rounded to the compute
    // dtype, as PEFT starts a bf16 model): the factors, and the residual the quantiser rounds.
    const WeightRows read = [&, s](int64_t first, int64_t count, std::span<float> out) {
      const std::span<float> rows = out.first(size_t(count * m.cols));
      values(s, first * m.cols, rows);
      round_to_weight_dtype(rows, qp.weight_dtype);
    };
    started->push_back(start_module(ex, m, read, staging));
    started->back().piece = s;
    quantized_started_.insert(m.name);
  }
  if (started->empty()) return values;
  return [values = std::move(values), started, cols = qp.cols, dtype = qp.weight_dtype](size_t s, int64_t first,
                                                                                      std::span<float> out) {
    values(s, first, out);
    for (const Started& st : *started)
      if (st.piece == s) {
        round_to_weight_dtype(out, dtype);  // (W rounded) - scale B A, which the quantiser rounds again
        subtract_low_rank_elements(out, first, cols, st.f, st.scale);
      }
  };
}

void BaseStart::start(Executor& ex, TensorStaging& staging) {
  if (!rewrites_base(lora_)) return;
  const Program& p = ex.program();
  const char* init = init_title(lora_);
  for (const LinearModule& m : lora_targets(p, lora_)) {
    const ParamEntry& w = param_named(p, m.weight);
    if (is_quantized_param(w)) {
      MEMFIT_CHECK(quantized_started_.count(m.name) > 0, "lora",
                   "{} on the quantised base {}: its start is made from the float values as they are quantised, "
                   "which this run's loading did not do", init, m.weight);
      continue;
    }
    const bool sharded = !w.storage_shard.empty() || p.tensor(p.root_of(w.value)).category == Category::communication;
    MEMFIT_CHECK(!sharded, "lora",
                 "{} with ZeRO-3: the adapters start from the whole weight {}, which no rank holds; start at --zero "
                 "0, 1 or 2 and resume its checkpoint (--resume takes any layout) at ZeRO-3", init, m.weight);
    const WeightRows read = [&](int64_t first, int64_t count, std::span<float> out) {
      load_parameter_range(ex, w, (m.row_begin + first) * m.cols, out.first(size_t(count * m.cols)), staging);
    };
    const Started st = start_module(ex, m, read, staging);
    const std::span<float> chunk = staging.values();
    const int64_t step = chunk_rows(m.cols);
    for (int64_t r0 = 0; r0 < m.rows; r0 += step) {
      const int64_t h = std::min(step, m.rows - r0);
      const std::span<float> rows = chunk.first(size_t(h * m.cols));
      read(r0, h, rows);
      subtract_low_rank(rows, r0, h, m.cols, st.f, st.scale);
      store_parameter_range(ex, w, (m.row_begin + r0) * m.cols, rows, staging);
    }
  }
}

uint64_t base_start_scratch_bytes(const Program& p, const LoraPolicy& lora) {
  if (!rewrites_base(lora)) return 0;
  uint64_t most = 0, quantized = 0;
  for (const LinearModule& m : lora_targets(p, lora)) {
    const std::string path = lora_module_path(p, m.name);
    const int64_t rank = lora.rank_of(path);
    const uint64_t chunk = uint64_t(chunk_rows(m.cols) * m.cols) * sizeof(float);
    most = std::max(most, chunk + factor_scratch_bytes(m.rows, m.cols, rank, lora.init == LoraInit::pissa,
                                                       lora.pissa_niter));
    // A quantised weight's factors live until its pieces are quantised (all of its targets').
    if (is_quantized_param(param_named(p, m.weight)))
      quantized = std::max<uint64_t>(quantized, uint64_t(rank * (m.rows + m.cols)) * 3 * sizeof(float));
  }
  return most + quantized;
}

}  // namespace memfit
