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

std::string strip_prefix(const std::string& name) {
  const std::string prefix = "transformer.";
  return name.starts_with(prefix) ? name.substr(prefix.size()) : name;
}

// Tensors HF checkpoints carry that are not parameters of memfit's model.
bool is_ignored_buffer(const std::string& name) {
  return name == "lm_head.weight" || name.ends_with(".attn.bias") || name.ends_with(".attn.masked_bias");
}

}  // namespace

void load_weights(const std::string& path, Executor& ex, const ModelSpec& spec) {
  MEMFIT_CHECK(spec.arch == Arch::gpt2, "safetensors", "loading {} weights is not supported yet", arch_name(spec.arch));
  fs::path file(path);
  if (fs::is_directory(file)) file /= "model.safetensors";
  const SafetensorsReader reader(file.string());
  const Program& p = ex.program();

  std::map<std::string, const SafetensorsEntry*> by_name;
  for (const SafetensorsEntry& e : reader.entries()) {
    const std::string name = strip_prefix(e.name);
    if (is_ignored_buffer(name)) continue;
    MEMFIT_CHECK(by_name.emplace(name, &e).second, "safetensors", "{}: tensor '{}' appears twice (with and without the "
                 "'transformer.' prefix)", file.string(), name);
  }
  std::set<std::string> used;
  std::vector<float> staging;  // a 16-bit parameter without an fp32 master
  for (const ParamEntry& param : p.params()) {
    auto it = by_name.find(param.name);
    MEMFIT_CHECK(it != by_name.end(), "safetensors", "{} has no tensor '{}' (nor 'transformer.{}')", file.string(),
                 param.name, param.name);
    used.insert(param.name);
    const TensorDesc& t = p.tensor(param.value);
    float* dst = fp32_values(ex, param);
    if (!dst) staging.assign(size_t(t.numel()), 0.0f), dst = staging.data();
    Shape expected = t.shape;
    const bool transpose = is_conv1d_weight(param.name);
    if (transpose) expected = Shape{t.shape[1], t.shape[0]};
    if (param.name == "wte.weight") expected = Shape{spec.vocab_size, spec.n_embd};  // padded rows are memfit's own
    reader.read_f32(it->second->name, expected, dst, transpose);
    if (param.name == "wte.weight")  // padded rows are memfit's own: zero
      std::fill(dst + spec.vocab_size * spec.n_embd, dst + spec.padded_vocab * spec.n_embd, 0.0f);
    store_parameter(ex, param, dst);
  }
  for (const auto& [name, entry] : by_name)
    MEMFIT_CHECK(used.count(name), "safetensors", "{} holds tensor '{}', which model '{}' does not have", file.string(),
                 entry->name, spec.name);
}

void save_weights(const std::string& path, const Executor& ex, const ModelSpec& spec,
                  const std::vector<std::vector<float>>* whole) {
  MEMFIT_CHECK(spec.arch == Arch::gpt2, "safetensors", "saving {} weights is not supported yet", arch_name(spec.arch));
  const Program& p = ex.program();
  fs::path file(path);
  const bool directory = !path.ends_with(".safetensors");
  if (directory) {
    std::error_code ec;
    fs::create_directories(file, ec);
    MEMFIT_CHECK(!ec, "safetensors", "cannot create directory '{}': {}", path, ec.message());
    file /= "model.safetensors";
  }
  // Transposed copies for Conv1D weights; everything else is written from the arena.
  // (fp32 values: the masters under mixed precision, widened copies of frozen 16-bit ones).
  std::vector<std::vector<float>> transposed;
  transposed.reserve(2 * p.params().size());
  std::vector<SafetensorsTensor> tensors;
  for (size_t i = 0; i < p.params().size(); ++i) {
    const ParamEntry& param = p.params()[i];
    const TensorDesc& t = p.tensor(param.value);
    const float* src = whole ? (*whole)[i].data() : fp32_values(ex, param);
    if (!src) src = transposed.emplace_back(load_parameter(ex, param)).data();
    SafetensorsTensor st{"transformer." + param.name, DType::f32, t.shape, src};
    if (is_conv1d_weight(param.name)) {
      const int64_t rows = t.shape[0], cols = t.shape[1];
      std::vector<float>& buf = transposed.emplace_back(size_t(rows * cols));
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < cols; ++c) buf[size_t(c * rows + r)] = src[r * cols + c];
      st.shape = Shape{cols, rows};
      st.data = buf.data();
    }
    if (param.name == "wte.weight") st.shape = Shape{spec.vocab_size, spec.n_embd};
    tensors.push_back(st);
  }
  write_safetensors(file.string(), tensors, {{"format", "pt"}, {"producer", "memfit"}});
  if (directory) {
    const fs::path config = fs::path(path) / "config.json";
    const fs::path tmp = fs::path(path) / "config.json.tmp";
    {
      std::ofstream out(tmp);
      out << gpt2_hf_config(spec).dump(2) << "\n";
      MEMFIT_CHECK(out.good(), "safetensors", "cannot write '{}'", tmp.string());
    }
    fs::rename(tmp, config);
  }
}

}  // namespace memfit
