#include "train/init.hpp"

#include <algorithm>
#include <map>
#include <utility>
#include <vector>

#include "core/error.hpp"
#include "train/lora_base_start.hpp"
#include "train/master_weights.hpp"
#include "train/quantized_weights.hpp"
#include "train/rng.hpp"

namespace memfit {

namespace {

// Elements per random stream: stream c draws elements [c * kStream, (c + 1) * kStream), so
// every value is fixed by (seed, name, element) whatever the staging size or thread count.
constexpr int64_t kStream = 1 << 16;
static_assert(TensorStaging::kElements % kStream == 0, "a staging chunk holds whole random streams");

// Stream c of a parameter whose seed is `base`, and its next value (normal(0, init_std), or
// U(-init_std, init_std) for ParamInit::uniform).
Rng stream_rng(uint64_t base, int64_t c) { return Rng(base + uint64_t(c) * 0x9E3779B97F4A7C15ull); }
float next_value(Rng& rng, const ParamEntry& e) {
  return float(e.init == ParamInit::uniform ? (2.0 * rng.uniform() - 1.0) * double(e.init_std)
                                            : rng.normal() * double(e.init_std));
}

// Draws elements [first, first + x.size()) of parameter e into x.
void draw_values(const ParamEntry& e, uint64_t base, int64_t first, std::span<float> x) {
  if (e.init == ParamInit::zeros || e.init == ParamInit::ones || e.init == ParamInit::row_norm) {
    std::fill(x.begin(), x.end(), e.init == ParamInit::zeros ? 0.0f : 1.0f);
    return;
  }
  const int64_t end = first + int64_t(x.size());
#pragma omp parallel for schedule(static)
  for (int64_t c = first / kStream; c < (end + kStream - 1) / kStream; ++c) {
    Rng rng = stream_rng(base, c);
    const int64_t stop = std::min(end, (c + 1) * kStream);
    for (int64_t i = c * kStream; i < stop; ++i) {
      // A range may start inside a stream (a quantised weight's pieces start anywhere): the
      // stream's earlier values are drawn and dropped, so every element keeps its value.
      const float v = next_value(rng, e);
      if (i >= first) x[size_t(i - first)] = v;
    }
  }
}

// Draws a tensor-parallel slice's elements: the runs of local elements [first, first +
// chunk.size()) at their one-rank positions. Each random stream a run touches is drawn once,
// up to the last element any run needs, and every run's piece of it copied out: drawing run
// by run (draw_values) redrew a stream from its start for each of its rows, up to 16x the
// draws for a 4096-wide column split.
void draw_slice(const ParamEntry& e, uint64_t base, const std::vector<SliceRun>& runs, int64_t first,
                std::span<float> chunk) {
  if (e.init == ParamInit::zeros || e.init == ParamInit::ones || e.init == ParamInit::row_norm || runs.size() <= 1) {
    for (const SliceRun& r : runs) draw_values(e, base, r.global, chunk.subspan(size_t(r.local - first), size_t(r.count)));
    return;
  }
  std::map<int64_t, std::vector<size_t>> runs_of_stream;
  for (size_t k = 0; k < runs.size(); ++k)
    for (int64_t c = runs[k].global / kStream; c <= (runs[k].global + runs[k].count - 1) / kStream; ++c)
      runs_of_stream[c].push_back(k);
  const std::vector<std::pair<int64_t, std::vector<size_t>>> streams(runs_of_stream.begin(), runs_of_stream.end());
#pragma omp parallel
  {
    std::vector<float> values(static_cast<size_t>(kStream));
#pragma omp for schedule(static)
    for (int64_t s = 0; s < int64_t(streams.size()); ++s) {
      const auto& [c, ks] = streams[size_t(s)];
      const int64_t begin = c * kStream;
      int64_t stop = begin;
      for (size_t k : ks) stop = std::max(stop, std::min(begin + kStream, runs[k].global + runs[k].count));
      Rng rng = stream_rng(base, c);
      for (int64_t i = 0; i < stop - begin; ++i) values[size_t(i)] = next_value(rng, e);
      for (size_t k : ks) {
        const SliceRun& r = runs[k];
        const int64_t a = std::max(begin, r.global), b = std::min(stop, r.global + r.count);
        std::copy(values.begin() + (a - begin), values.begin() + (b - begin),
                  chunk.begin() + (r.local - first + (a - r.global)));
      }
    }
  }
}

}  // namespace

void initialize_parameters(Executor& ex, const ModelSpec& spec, uint64_t seed, TensorStaging& staging,
                           const std::function<bool(const ParamEntry&)>& only, BaseStart* start) {
  const Program& p = ex.program();
  const std::span<float> x = staging.values();
  for (const ParamEntry& e : p.params()) {
    if ((only && !only(e)) || (start && start->stored(e.name))) continue;
    const uint64_t base = derive_seed(seed, e.name);
    if (is_quantized_param(e)) {
      // Drawn a chunk at a time (the same values as unquantised, stream by stream) as the
      // quantiser asks: a whole fp32 copy of the largest weight (46 MiB for a TinyLlama
      // gate_proj) would lift the process's peak RSS above its plan.
      SegmentValues values = segment_values(p, e, [&](int64_t first, std::span<float> out) {
        draw_values(e, base, first, out);
      });
      if (start) values = start->quantized_values(ex, e, std::move(values), staging);
      store_quantized_parameter(ex, e, values, staging);
      continue;
    }
    require_float_values(e);
    const Shape& local = p.tensor(e.value).shape;
    const int64_t n = local.numel();
    for (int64_t first = 0; first < n; first += int64_t(x.size())) {
      const std::span<float> chunk = x.first(size_t(std::min<int64_t>(int64_t(x.size()), n - first)));
      // A tensor-parallel slice draws the one-rank tensor's values at the elements it holds.
      draw_slice(e, base, slice_runs(e.split, local, first, int64_t(chunk.size())), first, chunk);
      store_parameter_range(ex, e, first, chunk, staging);
    }
  }
  if (!only) zero_padded_vocab_rows(ex, spec, staging);
}

void initialize_parameters(Executor& ex, const ModelSpec& spec, uint64_t seed) {
  TensorStaging staging;
  initialize_parameters(ex, spec, seed, staging);
}

void zero_padded_vocab_rows(Executor& ex, const ModelSpec& spec, TensorStaging& staging) {
  const Program& p = ex.program();
  const TensorId wte = p.find_tensor("wte.weight");
  if (wte == kNoTensor || spec.padded_vocab == spec.vocab_size) return;
  // All-zero bits are +0 in fp32, bf16 and fp16 alike; the master (if any) is zeroed too.
  // Under tensor parallelism this rank's rows are a slice of the vocabulary.
  const ParamEntry* entry = nullptr;
  for (const ParamEntry& e : p.params())
    if (e.value == wte) entry = &e;
  const int64_t rows = p.tensor(wte).shape[0];
  const int64_t begin = entry && entry->split.split() ? int64_t(entry->split.index) * rows : 0;
  const int64_t pad_first = std::clamp(spec.vocab_size - begin, int64_t(0), rows);
  if (pad_first == rows) return;
  const int64_t first = pad_first * spec.n_embd, count = (rows - pad_first) * spec.n_embd;
  const DType dt = p.tensor(wte).dtype;
  const std::span<std::byte> raw = staging.raw();
  for (const ParamEntry& e : p.params()) {
    if (e.value != wte || e.value_shard == kNoTensor) continue;
    // ZeRO-3: only this rank's piece persists.
    const int64_t a = std::max(first, e.shard_offset), b = std::min(first + count, e.shard_offset + e.shard_numel);
    if (a < b) zero_bytes(ex, e.value_shard, dtype_bytes(dt, a - e.shard_offset), dtype_bytes(dt, b - a), raw);
    if (e.master == kNoTensor) return;
  }
  const bool sharded_value = p.tensor(p.root_of(wte)).category == Category::communication;
  if (!sharded_value) zero_bytes(ex, wte, dtype_bytes(dt, first), dtype_bytes(dt, count), raw);
  for (const ParamEntry& e : p.params())
    if (e.value == wte && e.master != kNoTensor) {
      // A ZeRO piece holds elements [shard_offset, shard_offset + shard_numel) of the parameter.
      const int64_t lo = e.whole_state() ? 0 : e.shard_offset;
      const int64_t hi = e.whole_state() ? first + count : e.shard_offset + e.shard_numel;
      const int64_t a = std::max(first, lo), b = std::min(first + count, hi);
      if (a < b) zero_bytes(ex, e.master, sizeof(float) * uint64_t(a - lo), sizeof(float) * uint64_t(b - a), raw);
    }
}

namespace {

// The bytes of parameter roots that no parameter's tensor covers: ZeRO's alignment gaps and
// bucket padding (at stage 3, whole shards of a rank that holds only padding). Zeroed once,
// so every byte of an offloaded shard is written (the disk tier measures the highest byte
// written, the host arena the highest one changed) and gathers copy zeros, not stale bytes.
void zero_parameter_padding(Executor& ex, TensorStaging& staging) {
  const Program& p = ex.program();
  std::map<TensorId, std::vector<std::pair<uint64_t, uint64_t>>> covered;
  for (size_t id = 0; id < p.tensors().size(); ++id) {
    const TensorDesc& t = p.tensors()[id];
    if (!t.is_view() && t.lifetime == Lifetime::persistent && t.category == Category::parameters)
      covered[TensorId(id)];
  }
  for (const ParamEntry& e : p.params()) {
    std::vector<TensorId> ids{e.value, e.value_shard};
    for (const StoredTensor& st : e.storage) ids.push_back(st.id);
    for (const ParamEntry::StoragePiece& piece : e.storage_shard) ids.push_back(piece.view);
    for (TensorId id : ids) {
      if (id == kNoTensor) continue;
      const TensorDesc& t = p.tensor(id);
      auto it = covered.find(p.root_of(id));
      if (it == covered.end()) continue;
      const uint64_t begin = t.is_view() ? t.view_offset : 0;
      it->second.push_back({begin, begin + t.bytes()});
    }
  }
  for (auto& [root, ranges] : covered) {
    std::sort(ranges.begin(), ranges.end());
    uint64_t at = 0;
    ranges.push_back({p.tensor(root).bytes(), p.tensor(root).bytes()});
    for (const auto& [begin, end] : ranges) {
      if (begin > at) zero_bytes(ex, root, at, begin - at, staging.raw());
      at = std::max(at, end);
    }
  }
}

}  // namespace

void zero_persistent_state(Executor& ex, TensorStaging& staging) {
  const Program& p = ex.program();
  zero_parameter_padding(ex, staging);
  for (size_t id = 0; id < p.tensors().size(); ++id) {
    const TensorDesc& t = p.tensors()[id];
    if (t.is_view() || t.lifetime != Lifetime::persistent || t.category == Category::parameters ||
        t.category == Category::master_weights)
      continue;
    zero_bytes(ex, TensorId(id), 0, t.bytes(), staging.raw());
  }
}

void zero_persistent_state(Executor& ex) {
  TensorStaging staging;
  zero_persistent_state(ex, staging);
}

}  // namespace memfit
