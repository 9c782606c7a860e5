#include "train/init.hpp"

#include <algorithm>
#include <cstring>

#include "core/error.hpp"
#include "train/master_weights.hpp"
#include "train/rng.hpp"

namespace memfit {

void initialize_parameters(Executor& ex, const ModelSpec& spec, uint64_t seed) {
  const Program& p = ex.program();
  constexpr int64_t kChunk = 1 << 16;
  std::vector<float> staging;  // a 16-bit parameter without an fp32 master (frozen)
  for (const ParamEntry& e : p.params()) {
    float* x = fp32_values(ex, e);  // first: refuses storage other than one value tensor
    const int64_t n = p.tensor(e.value).numel();
    if (!x) staging.resize(size_t(n)), x = staging.data();
    if (e.init != ParamInit::normal) {
      const float v = e.init == ParamInit::ones ? 1.0f : 0.0f;
      std::fill(x, x + n, v);
      store_parameter(ex, e, x);
      continue;
    }
    const uint64_t base = derive_seed(seed, e.name);
#pragma omp parallel for schedule(static)
    for (int64_t c = 0; c < (n + kChunk - 1) / kChunk; ++c) {
      Rng rng(base + uint64_t(c) * 0x9E3779B97F4A7C15ull);
      const int64_t end = std::min(n, (c + 1) * kChunk);
      for (int64_t i = c * kChunk; i < end; ++i) x[i] = float(rng.normal() * double(e.init_std));
    }
    store_parameter(ex, e, x);
  }
  zero_padded_vocab_rows(ex, spec);
}

void zero_padded_vocab_rows(Executor& ex, const ModelSpec& spec) {
  const Program& p = ex.program();
  const TensorId wte = p.find_tensor("wte.weight");
  if (wte == kNoTensor || spec.padded_vocab == spec.vocab_size) return;
  // All-zero bits are +0 in fp32, bf16 and fp16 alike; the master (if any) is zeroed too.
  const int64_t first = spec.vocab_size * spec.n_embd, count = (spec.padded_vocab - spec.vocab_size) * spec.n_embd;
  const DType dt = p.tensor(wte).dtype;
  for (const ParamEntry& e : p.params()) {
    if (e.value != wte || e.value_shard == kNoTensor) continue;
    // ZeRO-3: only this rank's piece persists.
    const int64_t a = std::max(first, e.shard_offset), b = std::min(first + count, e.shard_offset + e.shard_numel);
    if (a < b) std::memset(ex.data(e.value_shard) + dtype_bytes(dt, a - e.shard_offset), 0, dtype_bytes(dt, b - a));
    if (e.master == kNoTensor) return;
  }
  const bool sharded_value = p.tensor(p.root_of(wte)).category == Category::communication;
  if (!sharded_value) std::memset(ex.data(wte) + dtype_bytes(dt, first), 0, dtype_bytes(dt, count));
  for (const ParamEntry& e : p.params())
    if (e.value == wte && e.master != kNoTensor) {
      // A ZeRO piece holds elements [shard_offset, shard_offset + shard_numel) of the parameter.
      const int64_t lo = e.whole_state() ? 0 : e.shard_offset;
      const int64_t hi = e.whole_state() ? first + count : e.shard_offset + e.shard_numel;
      const int64_t a = std::max(first, lo), b = std::min(first + count, hi);
      if (a < b) std::fill_n(ex.data_as<float>(e.master) + (a - lo), b - a, 0.0f);
    }
}

void zero_persistent_state(Executor& ex) {
  const Program& p = ex.program();
  for (size_t id = 0; id < p.tensors().size(); ++id) {
    const TensorDesc& t = p.tensors()[id];
    if (t.is_view() || t.lifetime != Lifetime::persistent || t.category == Category::parameters ||
        t.category == Category::master_weights)
      continue;
    std::memset(ex.data(TensorId(id)), 0, t.bytes());
  }
}

}  // namespace memfit
