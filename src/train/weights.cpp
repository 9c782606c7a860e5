#include "train/weights.hpp"

#include <algorithm>
#include <filesystem>
#include <functional>
#include <fstream>
#include <set>

#include "core/error.hpp"
#include "graph/quantize_base.hpp"
#include "io/hf_config.hpp"
#include "io/safetensors.hpp"
#include "io/safetensors_shards.hpp"
#include "train/adapter_files.hpp"
#include "train/lora_base_start.hpp"
#include "train/master_weights.hpp"
#include "train/quantized_weights.hpp"

namespace memfit {

namespace fs = std::filesystem;

bool is_conv1d_weight(const std::string& name) {
  for (const char* suffix : {"attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight"})
    if (name.ends_with(suffix)) return true;
  return false;
}

namespace {

constexpr std::string_view kGpt2Prefix = "transformer.";
constexpr std::string_view kFusedQkv = "self_attn.qkv_proj.";

bool is_vocab_table(const ModelSpec& spec, const std::string& param) {
  return spec.arch == Arch::gpt2 ? param == "wte.weight" : param == "embed_tokens.weight" || param == "lm_head.weight";
}

}  // namespace

std::vector<HfPiece> hf_pieces(const ModelSpec& spec, const std::string& param, const Shape& shape) {
  const int64_t rows = is_vocab_table(spec, param) ? spec.vocab_size : shape[0];
  if (spec.arch == Arch::gpt2) return {{param, rows}};
  if (param == "lm_head.weight") return {{param, rows}};
  const auto fused = param.find(kFusedQkv);
  if (fused == std::string::npos) return {{"model." + param, rows}};
  const std::string head = "model." + param.substr(0, fused) + "self_attn.";
  const std::string tail = param.substr(fused + kFusedQkv.size());  // "weight" or "bias"
  const int64_t q = spec.n_head * spec.head_dim(), kv = spec.n_kv_head * spec.head_dim();
  return {{head + "q_proj." + tail, q}, {head + "k_proj." + tail, kv}, {head + "v_proj." + tail, kv}};
}

namespace {

// A checkpoint's name in canonical form: the hub's gpt2 has no "transformer." prefix, and a
// bare LlamaModel's tensors have no "model." prefix.
std::string canonical_name(const ModelSpec& spec, const std::string& name) {
  if (spec.arch == Arch::gpt2) return name.starts_with(kGpt2Prefix) ? name.substr(kGpt2Prefix.size()) : name;
  return name.starts_with("model.") || name == "lm_head.weight" ? name : "model." + name;
}

// Tensors HF checkpoints carry that are not parameters of memfit's model.
bool is_ignored_buffer(const ModelSpec& spec, const std::string& name) {
  if (spec.arch == Arch::gpt2)
    return name == "lm_head.weight" || name.ends_with(".attn.bias") || name.ends_with(".attn.masked_bias");
  return name.ends_with(".rotary_emb.inv_freq") || (spec.tied_embeddings && name == "lm_head.weight");
}

}  // namespace

namespace {

// Stores elements [first, first + values.size()) of the one-rank parameter: under tensor
// parallelism only those this rank's slice holds (graph/tensor_parallel.hpp), so the loader
// reads HF tensors whole and in their order whatever the layout. The slice's runs, ascending in
// the global tensor, are listed once per parameter.
class GlobalStore {
 public:
  GlobalStore(Executor& ex, const ParamEntry& e) : ex_(ex), e_(e) {
    if (e.split.split()) runs_ = slice_runs(e.split, ex.program().tensor(e.value).shape);
  }
  void operator()(int64_t first, std::span<const float> values, TensorStaging& staging) const {
    if (!e_.split.split()) return store_parameter_range(ex_, e_, first, values, staging);
    const int64_t end = first + int64_t(values.size());
    auto r = std::partition_point(runs_.begin(), runs_.end(),
                                  [&](const SliceRun& run) { return run.global + run.count <= first; });
    for (; r != runs_.end() && r->global < end; ++r) {
      const int64_t a = std::max(first, r->global), b = std::min(end, r->global + r->count);
      store_parameter_range(ex_, e_, r->local + (a - r->global), values.subspan(size_t(a - first), size_t(b - a)),
                            staging);
    }
  }

 private:
  Executor& ex_;
  const ParamEntry& e_;
  std::vector<SliceRun> runs_;
};

}  // namespace

Shape one_rank_shape(const Program& p, const ParamEntry& e) {
  return e.split.split() ? e.split.global : p.tensor(e.value).shape;
}

void store_one_rank_range(Executor& ex, const ParamEntry& e, int64_t first, std::span<const float> values,
                          TensorStaging& staging) {
  GlobalStore(ex, e)(first, values, staging);
}

namespace {

// Reads HF GPT-2 Conv1D weight `name` (file shape [in, out]) into parameter e ([out, in]): whole
// file rows through staging.values(), each memfit row's slice gathered through staging.gather().
void load_transposed(const SafetensorsReader& reader, const std::string& name, const Shape& file_shape,
                     const GlobalStore& store, TensorStaging& staging) {
  const int64_t in = file_shape[0], out = file_shape[1];
  const std::span<float> rows = staging.values(), slice = staging.gather();
  const int64_t per_chunk = int64_t(rows.size()) / out;
  MEMFIT_CHECK(per_chunk >= 1, "safetensors", "tensor '{}' has rows of {} elements, more than the staging buffer's {}",
               name, out, rows.size());
  for (int64_t i0 = 0; i0 < in; i0 += per_chunk) {
    const int64_t k = std::min(per_chunk, in - i0);
    reader.read_f32_range(name, file_shape, i0 * out, rows.first(size_t(k * out)));
    for (int64_t o = 0; o < out; ++o) {
      for (int64_t j = 0; j < k; ++j) slice[size_t(j)] = rows[size_t(j * out + o)];
      store(o * in + i0, slice.first(size_t(k)), staging);
    }
  }
}

// Elements [first, first + n) of a file tensor in file order into the parameter from element `at` on.
void load_in_order(const SafetensorsReader& reader, const std::string& name, const Shape& file_shape, int64_t n,
                   const GlobalStore& store, int64_t at, TensorStaging& staging) {
  const std::span<float> values = staging.values();
  for (int64_t done = 0; done < n; done += int64_t(values.size())) {
    const std::span<float> chunk = values.first(size_t(std::min<int64_t>(int64_t(values.size()), n - done)));
    reader.read_f32_range(name, file_shape, done, chunk);
    store(at + done, chunk, staging);
  }
}

// Parameter elements [first, end) set to zero.
void store_zeros(const GlobalStore& store, int64_t first, int64_t end, TensorStaging& staging) {
  const std::span<float> zeros = staging.values();
  std::fill(zeros.begin(), zeros.end(), 0.0f);
  for (int64_t at = first; at < end; at += int64_t(zeros.size()))
    store(at, zeros.first(size_t(std::min<int64_t>(int64_t(zeros.size()), end - at))), staging);
}

// Elements [first, first + out.size()) of the transpose ([out, in], memfit's order) of the
// [in, out] file tensor `name` (GPT-2's Conv1D, which bnb also quantises transposed): each file
// row's run of the columns the range touches is read into `row`, then scattered.
void read_transposed_range(const SafetensorsReader& reader, const std::string& name, const Shape& file_shape,
                           int64_t first, std::span<float> out, std::span<float> row) {
  const int64_t in = file_shape[0], cols = file_shape[1], end = first + int64_t(out.size());
  const int64_t o_lo = first / in, o_hi = (end - 1) / in;
  MEMFIT_CHECK(o_hi - o_lo + 1 <= int64_t(row.size()), "safetensors", "tensor '{}': {} columns at once do not fit the "
               "staging buffer's {} elements", name, o_hi - o_lo + 1, row.size());
  for (int64_t i = 0; i < in; ++i) {
    reader.read_f32_range(name, file_shape, i * cols + o_lo, row.first(size_t(o_hi - o_lo + 1)));
    for (int64_t o = o_lo; o <= o_hi; ++o)
      if (const int64_t j = o * in + i; j >= first && j < end) out[size_t(j - first)] = row[size_t(o - o_lo)];
  }
}

using TensorsByName = std::map<std::string, const SafetensorsShards::Located*>;

// A quantised parameter from its HF tensors (Llama's q, k and v are its pieces), quantised a
// chunk at a time as they are read (train/quantized_weights.hpp).
void load_quantized(const TensorsByName& by_name, const std::string& file, const ModelSpec& spec, Executor& ex,
                    const ParamEntry& param, TensorStaging& staging, std::set<std::string>& used, BaseStart* start) {
  const QuantizedParam qp = quantized_param_of(ex.program(), param);
  const std::vector<HfPiece> pieces = hf_pieces(spec, param.name, Shape{qp.rows, qp.cols});
  MEMFIT_CHECK(pieces.size() == qp.segments.size(), "train", "parameter '{}' is quantised as {} pieces, not the {} HF "
               "tensors it is made of", param.name, qp.segments.size(), pieces.size());
  std::vector<const SafetensorsShards::Located*> sources;
  for (size_t s = 0; s < pieces.size(); ++s) {
    auto it = by_name.find(pieces[s].name);
    MEMFIT_CHECK(it != by_name.end(), "safetensors", "{} has no tensor '{}'", file, pieces[s].name);
    MEMFIT_CHECK(pieces[s].rows == qp.segments[s], "train", "parameter '{}': piece '{}' has {} rows, quantised as {}",
                 param.name, pieces[s].name, pieces[s].rows, qp.segments[s]);
    used.insert(pieces[s].name);
    sources.push_back(it->second);
  }
  const bool transpose = spec.arch == Arch::gpt2 && is_conv1d_weight(param.name);
  SegmentValues values = [&](size_t s, int64_t first, std::span<float> out) {
    const SafetensorsReader& reader = *sources[s]->shard;
    const std::string& name = sources[s]->entry->name;
    if (transpose) read_transposed_range(reader, name, Shape{qp.cols, qp.segments[s]}, first, out, staging.gather());
    else reader.read_f32_range(name, Shape{qp.segments[s], qp.cols}, first, out);
  };
  if (start) values = start->quantized_values(ex, param, std::move(values), staging);
  store_quantized_parameter(ex, param, values, staging);
}

}  // namespace

void load_weights(const std::string& path, Executor& ex, const ModelSpec& spec, TensorStaging& staging,
                  BaseStart* start) {
  const SafetensorsShards shards(path);  // one file, or an index and its shards
  const std::string& file = shards.description();
  const Program& p = ex.program();
  const std::string_view prefix = spec.arch == Arch::gpt2 ? kGpt2Prefix : "model.";

  TensorsByName by_name;
  for (const SafetensorsShards::Located& e : shards.tensors()) {
    const std::string name = canonical_name(spec, e.entry->name);
    if (is_ignored_buffer(spec, name)) continue;
    MEMFIT_CHECK(by_name.emplace(name, &e).second, "safetensors", "{}: tensor '{}' appears twice (with and without the "
                 "'{}' prefix)", file, name, prefix);
  }
  std::set<std::string> used;
  for (const ParamEntry& param : p.params()) {
    if (is_lora_adapter(param.name)) continue;  // not in a base checkpoint: initialised, or --load-adapter
    if (is_quantized_param(param)) {
      load_quantized(by_name, file, spec, ex, param, staging, used, start);
      continue;
    }
    require_float_values(param);
    // The one-rank shape: a tensor-parallel slice takes its elements of it (GlobalStore).
    const Shape shape = one_rank_shape(p, param);
    const int64_t row_size = shape.numel() / shape[0];
    const bool transpose = spec.arch == Arch::gpt2 && is_conv1d_weight(param.name);
    const GlobalStore store(ex, param);
    int64_t row = 0;
    for (const HfPiece& piece : hf_pieces(spec, param.name, shape)) {
      auto it = by_name.find(piece.name);
      MEMFIT_CHECK(it != by_name.end(), "safetensors", "{} has no tensor '{}'", file, piece.name);
      used.insert(piece.name);
      const SafetensorsReader& reader = *it->second->shard;
      const std::string& name = it->second->entry->name;
      const Shape expected = shape.rank() == 1 ? Shape{piece.rows} : Shape{piece.rows, row_size};
      if (transpose) load_transposed(reader, name, Shape{shape[1], shape[0]}, store, staging);
      else load_in_order(reader, name, expected, piece.rows * row_size, store, row * row_size, staging);
      row += piece.rows;
    }
    store_zeros(store, row * row_size, shape.numel(), staging);  // padded vocabulary rows are memfit's own: zero
  }
  for (const auto& [name, entry] : by_name)
    MEMFIT_CHECK(used.count(name), "safetensors", "{} holds tensor '{}', which model '{}' does not have", file,
                 entry->entry->name, spec.name);
}

namespace {

using Emit = std::function<void(std::span<const std::byte>)>;
// Elements [first, first + out.size()) of parameter i as fp32.
using ParamValues = std::function<void(int64_t first, std::span<float> out)>;

// Emits parameter elements [first, first + n) in order through staging.values().
void emit_in_order(const ParamValues& get, int64_t first, int64_t n, std::span<float> values, const Emit& emit) {
  for (int64_t done = 0; done < n; done += int64_t(values.size())) {
    const std::span<float> chunk = values.first(size_t(std::min<int64_t>(int64_t(values.size()), n - done)));
    get(first + done, chunk);
    emit(std::as_bytes(chunk));
  }
}

// Emits a [rows, cols] parameter as [cols, rows] (HF GPT-2 Conv1D), whole output rows at a time.
void emit_transposed(const ParamValues& get, int64_t rows, int64_t cols, TensorStaging& staging, const Emit& emit) {
  const std::span<float> out = staging.values(), column = staging.gather();
  const int64_t per_chunk = int64_t(out.size()) / rows;
  MEMFIT_CHECK(per_chunk >= 1, "safetensors", "a weight of {} rows does not fit the staging buffer's {} elements", rows,
               out.size());
  for (int64_t c0 = 0; c0 < cols; c0 += per_chunk) {
    const int64_t k = std::min(per_chunk, cols - c0);
    for (int64_t r = 0; r < rows; ++r) {
      get(r * cols + c0, column.first(size_t(k)));
      for (int64_t j = 0; j < k; ++j) out[size_t(j * rows + r)] = column[size_t(j)];
    }
    emit(std::as_bytes(out.first(size_t(k * rows))));
  }
}

}  // namespace

void save_weights(const std::string& path, const Executor& ex, const ModelSpec& spec, TensorStaging& staging,
                  const std::vector<std::vector<float>>* whole, uint64_t max_shard_bytes) {
  const Program& p = ex.program();
  std::vector<SavedParam> params;
  for (const ParamEntry& param : p.params()) params.push_back({param.name, p.tensor(param.value).shape});
  save_weights_from(path, params, spec, staging, [&](size_t i, int64_t first, std::span<float> out) {
    if (whole) std::copy_n((*whole)[i].begin() + first, out.size(), out.begin());
    else load_parameter_range(ex, p.params()[i], first, out, staging);
  }, max_shard_bytes);
}

void save_weights_from(const std::string& path, const std::vector<SavedParam>& params, const ModelSpec& spec,
                       TensorStaging& staging, const ParamRange& values, uint64_t max_shard_bytes) {
  const bool directory = !path.ends_with(".safetensors");
  if (directory) {
    std::error_code ec;
    fs::create_directories(path, ec);
    MEMFIT_CHECK(!ec, "safetensors", "cannot create directory '{}': {}", path, ec.message());
  }
  // Every tensor is produced while the file is written, a staging chunk at a time: fp32 values
  // (the masters under mixed precision, widened copies of 16-bit ones), transposed for GPT-2's
  // Conv1D weights.
  std::vector<SafetensorsTensor> tensors;
  for (size_t i = 0; i < params.size(); ++i) {
    const SavedParam& param = params[i];
    const Shape& shape = param.shape;
    ParamValues get = [&values, i](int64_t first, std::span<float> out) { values(i, first, out); };
    if (spec.arch == Arch::gpt2 && is_conv1d_weight(param.name)) {
      const int64_t rows = shape[0], cols = shape[1];
      tensors.push_back({std::string(kGpt2Prefix) + param.name, DType::f32, Shape{cols, rows}, nullptr,
                         [get, rows, cols, &staging](const Emit& emit) {
                           emit_transposed(get, rows, cols, staging, emit);
                         }});
      continue;
    }
    const int64_t row_size = shape.numel() / shape[0];
    int64_t row = 0;
    for (const HfPiece& piece : hf_pieces(spec, param.name, shape)) {
      const std::string name = spec.arch == Arch::gpt2 ? std::string(kGpt2Prefix) + piece.name : piece.name;
      const Shape piece_shape = shape.rank() == 1 ? Shape{piece.rows} : Shape{piece.rows, row_size};
      const int64_t first = row * row_size, n = piece.rows * row_size;
      tensors.push_back({name, DType::f32, piece_shape, nullptr, [get, first, n, &staging](const Emit& emit) {
                           emit_in_order(get, first, n, staging.values(), emit);
                         }});
      row += piece.rows;
    }
  }
  const std::map<std::string, std::string> metadata = {{"format", "pt"}, {"producer", "memfit"}};
  if (directory) write_safetensors_shards(path, tensors, max_shard_bytes, metadata);
  else write_safetensors(path, tensors, metadata);
  if (directory) {
    const fs::path config = fs::path(path) / "config.json";
    const fs::path tmp = fs::path(path) / "config.json.tmp";
    {
      std::ofstream out(tmp);
      out << hf_config(spec).dump(2) << "\n";
      MEMFIT_CHECK(out.good(), "safetensors", "cannot write '{}'", tmp.string());
    }
    fs::rename(tmp, config);
  }
}

}  // namespace memfit
