#include "train/weights.hpp"

#include <filesystem>
#include <fstream>
#include <set>

#include "core/error.hpp"
#include "io/hf_config.hpp"
#include "io/safetensors.hpp"
#include "train/master_weights.hpp"

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

void load_weights(const std::string& path, Executor& ex, const ModelSpec& spec) {
  fs::path file(path);
  if (fs::is_directory(file)) file /= "model.safetensors";
  const SafetensorsReader reader(file.string());
  const Program& p = ex.program();
  const std::string_view prefix = spec.arch == Arch::gpt2 ? kGpt2Prefix : "model.";

  std::map<std::string, const SafetensorsEntry*> by_name;
  for (const SafetensorsEntry& e : reader.entries()) {
    const std::string name = canonical_name(spec, e.name);
    if (is_ignored_buffer(spec, name)) continue;
    MEMFIT_CHECK(by_name.emplace(name, &e).second, "safetensors", "{}: tensor '{}' appears twice (with and without the "
                 "'{}' prefix)", file.string(), name, prefix);
  }
  std::set<std::string> used;
  std::vector<float> staging;  // a 16-bit parameter without an fp32 master
  for (const ParamEntry& param : p.params()) {
    const TensorDesc& t = p.tensor(param.value);
    float* dst = fp32_values(ex, param);
    if (!dst) staging.assign(size_t(t.numel()), 0.0f), dst = staging.data();
    const int64_t row_size = t.numel() / t.shape[0];
    const bool transpose = spec.arch == Arch::gpt2 && is_conv1d_weight(param.name);
    int64_t row = 0;
    for (const HfPiece& piece : hf_pieces(spec, param.name, t.shape)) {
      auto it = by_name.find(piece.name);
      MEMFIT_CHECK(it != by_name.end(), "safetensors", "{} has no tensor '{}'", file.string(), piece.name);
      used.insert(piece.name);
      Shape expected = t.shape.rank() == 1 ? Shape{piece.rows} : Shape{piece.rows, row_size};
      if (transpose) expected = Shape{t.shape[1], t.shape[0]};
      reader.read_f32(it->second->name, expected, dst + row * row_size, transpose);
      row += piece.rows;
    }
    std::fill(dst + row * row_size, dst + t.numel(), 0.0f);  // padded vocabulary rows are memfit's own: zero
    store_parameter(ex, param, dst);
  }
  for (const auto& [name, entry] : by_name)
    MEMFIT_CHECK(used.count(name), "safetensors", "{} holds tensor '{}', which model '{}' does not have", file.string(),
                 entry->name, spec.name);
}

void save_weights(const std::string& path, const Executor& ex, const ModelSpec& spec,
                  const std::vector<std::vector<float>>* whole) {
  const Program& p = ex.program();
  fs::path file(path);
  const bool directory = !path.ends_with(".safetensors");
  if (directory) {
    std::error_code ec;
    fs::create_directories(file, ec);
    MEMFIT_CHECK(!ec, "safetensors", "cannot create directory '{}': {}", path, ec.message());
    file /= "model.safetensors";
  }
  // Transposed copies for GPT-2's Conv1D weights; everything else is written from the arena
  // (fp32 values: the masters under mixed precision, widened copies of frozen 16-bit ones).
  std::vector<std::vector<float>> copies;
  copies.reserve(2 * p.params().size());
  std::vector<SafetensorsTensor> tensors;
  for (size_t i = 0; i < p.params().size(); ++i) {
    const ParamEntry& param = p.params()[i];
    const TensorDesc& t = p.tensor(param.value);
    const float* src = whole ? (*whole)[i].data() : fp32_values(ex, param);
    if (!src) src = copies.emplace_back(load_parameter(ex, param)).data();
    if (spec.arch == Arch::gpt2 && is_conv1d_weight(param.name)) {
      const int64_t rows = t.shape[0], cols = t.shape[1];
      std::vector<float>& buf = copies.emplace_back(size_t(rows * cols));
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < cols; ++c) buf[size_t(c * rows + r)] = src[r * cols + c];
      tensors.push_back({std::string(kGpt2Prefix) + param.name, DType::f32, Shape{cols, rows}, buf.data()});
      continue;
    }
    const int64_t row_size = t.numel() / t.shape[0];
    int64_t row = 0;
    for (const HfPiece& piece : hf_pieces(spec, param.name, t.shape)) {
      const std::string name = spec.arch == Arch::gpt2 ? std::string(kGpt2Prefix) + piece.name : piece.name;
      const Shape shape = t.shape.rank() == 1 ? Shape{piece.rows} : Shape{piece.rows, row_size};
      tensors.push_back({name, DType::f32, shape, src + row * row_size});
      row += piece.rows;
    }
  }
  write_safetensors(file.string(), tensors, {{"format", "pt"}, {"producer", "memfit"}});
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
