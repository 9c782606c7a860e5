#include "train/adapter_files.hpp"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>

#include "core/error.hpp"
#include "graph/lora.hpp"
#include "io/safetensors.hpp"
#include "train/dora_init.hpp"
#include "train/master_weights.hpp"
#include "train/init.hpp"
#include "train/lora_base_start.hpp"
#include "train/run_config.hpp"
#include "train/weights.hpp"

namespace memfit {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

constexpr const char* kConfigFile = "adapter_config.json";
constexpr const char* kWeightsFile = "adapter_model.safetensors";

std::string shape_text(const Shape& s) {
  std::string out = "[";
  for (int i = 0; i < s.rank(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

json number(double v) { return v == std::floor(v) && std::fabs(v) < 1e15 ? json(int64_t(v)) : json(v); }

std::set<std::string> as_set(const std::vector<std::string>& v) { return {v.begin(), v.end()}; }

// One HF tensor of a trained bias (a fused parameter holds several: llama's q, k and v).
struct AdapterBias {
  size_t param = 0;          // index in Program::params()
  int64_t first = 0, count = 0;  // its elements in the parameter
  std::string name;          // PEFT's name in adapter_model.safetensors
};

// The biases that bias all | lora_only train, as PEFT saves them: under the names of its
// wrapped model, where a module that has a LoRA branch became a LoraLayer whose original
// module is `base_layer`. Chosen by the policy, not by trainability: an evaluation program
// holds the same biases frozen.
std::vector<AdapterBias> adapter_biases(const Program& p, const ModelSpec& spec, const LoraPolicy& lora) {
  static const std::string kA = ".lora_A.weight", kBias = ".bias";
  if (lora.bias == LoraBias::none) return {};
  std::set<std::string> wrapped;
  for (const ParamEntry& e : p.params())
    if (e.name.ends_with(kA)) {
      const std::string n = peft_tensor_name(spec, e.name);
      wrapped.insert(n.substr(0, n.size() - kA.size()));
    }
  const std::string prefix = std::string("base_model.model.") + (spec.arch == Arch::gpt2 ? "transformer." : "");
  std::vector<AdapterBias> out;
  for (size_t i = 0; i < p.params().size(); ++i) {
    const ParamEntry& e = p.params()[i];
    if (!e.name.ends_with(kBias) || is_lora_adapter(e.name)) continue;
    const Shape shape = one_rank_shape(p, e);
    int64_t first = 0;
    for (const HfPiece& piece : hf_pieces(spec, e.name, shape)) {
      const int64_t count = piece.rows * (shape.numel() / shape[0]);
      const std::string module = prefix + piece.name.substr(0, piece.name.size() - kBias.size());
      const bool has_branch = wrapped.count(module) > 0;
      MEMFIT_CHECK(has_branch || lora.bias == LoraBias::all || e.frozen(), "adapter",
                   "bias lora_only trains '{}', whose module has no LoRA branch (a fused q/k/v targeted in part): "
                   "PEFT would not save it; target all of q_proj, k_proj and v_proj, or use bias all",
                   piece.name);
      if (has_branch || lora.bias == LoraBias::all)
        out.push_back({i, first, count, module + (has_branch ? ".base_layer.bias" : ".bias")});
      first += count;
    }
  }
  return out;
}

// The parameters modules_to_save trains whole, as PEFT saves them: "base_model.model." and the
// HF name of the module's tensor (the real vocabulary's rows of an embedding table).
struct SavedModule {
  size_t param = 0;
  Shape shape;       // as HF holds it
  std::string name;  // PEFT's name in adapter_model.safetensors
};

std::vector<SavedModule> saved_modules(const Program& p, const ModelSpec& spec, const LoraPolicy& lora) {
  const std::vector<std::string> names = lora_modules_to_save(p, lora);
  std::vector<SavedModule> out;
  for (size_t i = 0; i < p.params().size(); ++i) {
    const ParamEntry& e = p.params()[i];
    if (!std::binary_search(names.begin(), names.end(), e.name)) continue;
    const Shape shape = one_rank_shape(p, e);
    const std::vector<HfPiece> pieces = hf_pieces(spec, e.name, shape);
    MEMFIT_ASSERT(pieces.size() == 1, "modules_to_save parameter {} is not one HF tensor", e.name);
    std::vector<int64_t> dims = shape.dims();
    dims[0] = pieces[0].rows;
    out.push_back({i, Shape(dims), peft_tensor_name(spec, e.name)});
  }
  return out;
}

}  // namespace

bool is_lora_adapter(const std::string& param) {
  return param.ends_with(".lora_A.weight") || param.ends_with(".lora_B.weight") ||
         param.ends_with(".lora_magnitude_vector");
}

std::string peft_tensor_name(const ModelSpec& spec, const std::string& param) {
  if (spec.arch != Arch::gpt2 && param.starts_with("lm_head.")) return "base_model.model." + param;
  return std::string("base_model.model.") + (spec.arch == Arch::gpt2 ? "transformer." : "model.") + param;
}

json adapter_config_json(const Program& p, const ModelSpec& spec, const LoraPolicy& lora,
                         const std::string& base_model) {
  json targets;
  const bool expand = lora.target_regex.empty() &&
                      (lora.targets.empty() || as_set(lora.targets).count("all-linear") > 0);
  if (!lora.target_regex.empty()) {
    targets = lora.target_regex;
  } else if (expand) {
    // PEFT writes the names "all-linear" stood for (every linear module's: exclusions are saved
    // beside them), or those its per-architecture default matched.
    std::set<std::string> names;
    const bool all_linear = !lora.targets.empty();  // expand: the targets are "all-linear" or none
    for (const LinearModule& m : all_linear ? linear_modules(p) : lora_targets(p, lora)) names.insert(m.short_name());
    targets = std::vector<std::string>(names.begin(), names.end());
  } else {
    targets = lora.targets;
  }
  json rank_pattern = json::object(), alpha_pattern = json::object();
  for (const auto& [key, r] : lora.rank_pattern) rank_pattern[key] = r;
  for (const auto& [key, a] : lora.alpha_pattern) alpha_pattern[key] = number(a);
  json config{{"alpha_pattern", alpha_pattern},
              {"auto_mapping", nullptr},
              {"base_model_name_or_path", base_model},
              {"bias", std::string(lora_bias_name(lora.bias))},
              {"fan_in_fan_out", spec.arch == Arch::gpt2},
              {"inference_mode", true},
              {"init_lora_weights", lora.init == LoraInit::peft_default ? json(true)
                                    : lora.init == LoraInit::random     ? json(false)
                                                                        : json(lora_init_name(lora))},
              {"layers_pattern", lora.layers_pattern.empty() ? json(nullptr) : json(lora.layers_pattern)},
              {"layers_to_transform", lora.layers_to_transform.empty() ? json(nullptr) : json(lora.layers_to_transform)},
              {"lora_alpha", number(lora.alpha)},
              {"lora_dropout", lora.dropout},
              {"modules_to_save", lora.modules_to_save.empty() ? json(nullptr) : json(lora.modules_to_save)},
              {"exclude_modules", !lora.exclude_regex.empty()     ? json(lora.exclude_regex)
                                  : lora.exclude_modules.empty() ? json(nullptr)
                                                                 : json(lora.exclude_modules)},
              {"peft_type", "LORA"},
              {"r", lora.rank},
              {"rank_pattern", rank_pattern},
              {"revision", nullptr},
              {"target_modules", targets},
              {"task_type", "CAUSAL_LM"},
              {"use_dora", lora.dora},
              {"use_rslora", lora.rslora}};
  // pissa_niter_N's start is a draw: memfit keeps its seed so that --load-adapter, merge-lora and
  // convert-lora rebuild the same residual (PEFT ignores the key, with a warning).
  if (lora.init == LoraInit::pissa && lora.pissa_niter >= 0 && lora.start_seed >= 0)
    config["memfit_start_seed"] = lora.start_seed;
  return config;
}

void apply_adapter_config(const std::string& dir, LoraPolicy& lora) {
  const std::string path = (fs::path(dir) / kConfigFile).string();
  std::ifstream in(path);
  MEMFIT_CHECK(in.good(), "adapter", "--load-adapter '{}' has no {} (a PEFT adapter directory holds it)", dir,
               kConfigFile);
  json j;
  try {
    j = json::parse(in);
  } catch (const json::exception& e) {
    throw Error("adapter", fmt::format("'{}' is not valid JSON: {}", path, e.what()));
  }
  MEMFIT_CHECK(j.is_object() && j.value("peft_type", std::string()) == "LORA", "adapter",
               "'{}' is not a LoRA adapter config (its peft_type is not LORA)", path);
  RunConfig file;
  file.policy.lora.rank = 0;
  apply_lora_config(j, file, /*weights_from_file=*/true);
  const LoraPolicy& f = file.policy.lora;
  MEMFIT_CHECK(f.enabled(), "adapter", "'{}' gives no rank r", path);
  if (lora.enabled()) {
    MEMFIT_CHECK(lora.rank == f.rank, "adapter", "--lora-rank {} but the adapter in '{}' has r = {}", lora.rank, dir,
                 f.rank);
    MEMFIT_CHECK(lora.alpha == f.alpha, "adapter", "lora_alpha {} but the adapter in '{}' has lora_alpha {}",
                 lora.alpha, dir, f.alpha);
    const bool given = !lora.targets.empty() || !lora.target_regex.empty();
    MEMFIT_CHECK(!given || (as_set(lora.targets) == as_set(f.targets) && lora.target_regex == f.target_regex),
                 "adapter", "--lora-targets differ from the target_modules of the adapter in '{}' ({})", dir,
                 j.at("target_modules").dump());
    if (!given) lora.targets = f.targets, lora.target_regex = f.target_regex;
    MEMFIT_CHECK(lora.bias == f.bias, "adapter", "LoRA bias '{}' but the adapter in '{}' has bias '{}'",
                 lora_bias_name(lora.bias), dir, lora_bias_name(f.bias));
    MEMFIT_CHECK(lora.rslora == f.rslora, "adapter", "{} but the adapter in '{}' has use_rslora {}",
                 lora.rslora ? "--lora-rslora" : "no --lora-rslora", dir, f.rslora);
    MEMFIT_CHECK(lora.dora == f.dora, "adapter", "{} but the adapter in '{}' has use_dora {}",
                 lora.dora ? "--lora-dora" : "no --lora-dora", dir, f.dora);
    MEMFIT_CHECK(lora.modules_to_save.empty() || as_set(lora.modules_to_save) == as_set(f.modules_to_save), "adapter",
                 "--lora-modules-to-save differs from the modules_to_save of the adapter in '{}' ({})", dir,
                 j.value("modules_to_save", json()).dump());
    lora.modules_to_save = f.modules_to_save;
    // Which modules the file's adapters wrap is the file's.
    lora.exclude_modules = f.exclude_modules, lora.exclude_regex = f.exclude_regex;
    lora.layers_to_transform = f.layers_to_transform, lora.layers_pattern = f.layers_pattern;
    lora.rank_pattern = f.rank_pattern, lora.alpha_pattern = f.alpha_pattern;
    // How the adapters started is the file's too (olora / pissa rewrite the base under them).
    MEMFIT_CHECK(lora.init == LoraInit::peft_default || (lora.init == f.init && lora.pissa_niter == f.pissa_niter),
                 "adapter", "--lora-init {} but the adapter in '{}' has init_lora_weights {}", lora_init_name(lora), dir,
                 lora_init_name(f));
    lora.init = f.init, lora.pissa_niter = f.pissa_niter, lora.start_seed = f.start_seed;
    return;
  }
  lora = f;
}

void save_adapter(const std::string& dir, const Executor& ex, const ModelSpec& spec, const LoraPolicy& lora,
                  const std::string& base_model, TensorStaging& staging,
                  const std::vector<std::vector<float>>* whole) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  MEMFIT_CHECK(!ec, "adapter", "cannot create directory '{}': {}", dir, ec.message());
  const Program& p = ex.program();
  std::vector<std::vector<float>> values;
  std::vector<SafetensorsTensor> tensors;
  values.reserve(p.params().size());
  for (size_t i = 0; i < p.params().size(); ++i) {
    const ParamEntry& e = p.params()[i];
    MEMFIT_ASSERT(whole || !e.trainable || !e.split.split(), "saving tensor-parallel {} needs it gathered", e.name);
    if (!is_lora_adapter(e.name)) continue;
    const Shape shape = one_rank_shape(p, e);
    if (whole) {
      values.push_back((*whole)[i]);
    } else {
      values.emplace_back(size_t(shape.numel()));
      load_parameter_range(ex, e, 0, values.back(), staging);
    }
    tensors.push_back({peft_tensor_name(spec, e.name), DType::f32, shape, values.back().data()});
  }
  MEMFIT_CHECK(!tensors.empty(), "adapter", "--save '{}': the run has no LoRA adapter to save", dir);
  for (const AdapterBias& b : adapter_biases(p, spec, lora)) {
    const ParamEntry& e = p.params()[b.param];
    if (whole) {
      const std::vector<float>& all = (*whole)[b.param];
      values.emplace_back(all.begin() + b.first, all.begin() + b.first + b.count);
    } else {
      values.emplace_back(size_t(b.count));
      load_parameter_range(ex, e, b.first, values.back(), staging);
    }
    tensors.push_back({b.name, DType::f32, Shape{b.count}, values.back().data()});
  }
  for (const SavedModule& m : saved_modules(p, spec, lora)) {
    if (whole) {
      const std::vector<float>& all = (*whole)[m.param];
      values.emplace_back(all.begin(), all.begin() + m.shape.numel());
    } else {
      values.emplace_back(size_t(m.shape.numel()));
      load_parameter_range(ex, p.params()[m.param], 0, values.back(), staging);
    }
    tensors.push_back({m.name, DType::f32, m.shape, values.back().data()});
  }
  write_safetensors((fs::path(dir) / kWeightsFile).string(), tensors, {{"format", "pt"}, {"producer", "memfit"}});
  const fs::path config = fs::path(dir) / kConfigFile, tmp = fs::path(dir) / "adapter_config.json.tmp";
  {
    std::ofstream out(tmp);
    out << adapter_config_json(p, spec, lora, base_model).dump(2) << "\n";
    MEMFIT_CHECK(out.good(), "adapter", "cannot write '{}'", tmp.string());
  }
  fs::rename(tmp, config);
}

void load_adapter(const std::string& dir, Executor& ex, const ModelSpec& spec, const LoraPolicy& lora,
                  TensorStaging& staging) {
  const std::string path = (fs::path(dir) / kWeightsFile).string();
  MEMFIT_CHECK(fs::exists(path), "adapter", "--load-adapter '{}' has no {}", dir, kWeightsFile);
  const SafetensorsReader reader(path);
  const Program& p = ex.program();
  std::set<std::string> used;
  for (const ParamEntry& e : p.params()) {
    if (!is_lora_adapter(e.name)) continue;
    const std::string name = peft_tensor_name(spec, e.name);
    const SafetensorsEntry* t = reader.find(name);
    MEMFIT_CHECK(t != nullptr, "adapter", "the adapter in '{}' was made for another base: it has no tensor '{}'", dir,
                 name);
    const Shape shape = one_rank_shape(p, e);
    MEMFIT_CHECK(t->shape == shape, "adapter",
                 "the adapter in '{}' was made for another base: '{}' is {} there, {} in model '{}'", dir, name,
                 shape_text(t->shape), shape_text(shape), spec.name);
    std::vector<float> v(size_t(shape.numel()));
    reader.read_f32(name, shape, v.data());
    store_one_rank_range(ex, e, 0, v, staging);
    used.insert(name);
  }
  for (const AdapterBias& b : adapter_biases(p, spec, lora)) {
    const SafetensorsEntry* t = reader.find(b.name);
    MEMFIT_CHECK(t != nullptr, "adapter", "the adapter in '{}' has no tensor '{}', a bias its bias '{}' trains", dir,
                 b.name, lora_bias_name(lora.bias));
    std::vector<float> v(size_t(b.count));
    reader.read_f32(b.name, Shape{b.count}, v.data());
    store_one_rank_range(ex, p.params()[b.param], b.first, v, staging);
    used.insert(b.name);
  }
  for (const SavedModule& m : saved_modules(p, spec, lora)) {
    const SafetensorsEntry* t = reader.find(m.name);
    MEMFIT_CHECK(t != nullptr, "adapter", "the adapter in '{}' has no tensor '{}', a module its modules_to_save trains",
                 dir, m.name);
    MEMFIT_CHECK(t->shape == m.shape, "adapter",
                 "the adapter in '{}' was made for another base: '{}' is {} there, {} in model '{}'", dir, m.name,
                 shape_text(t->shape), shape_text(m.shape), spec.name);
    std::vector<float> v(size_t(m.shape.numel()));
    reader.read_f32(m.name, m.shape, v.data());
    store_one_rank_range(ex, p.params()[m.param], 0, v, staging);
    used.insert(m.name);
  }
  for (const SafetensorsEntry& t : reader.entries())
    MEMFIT_CHECK(used.count(t.name) > 0, "adapter",
                 "the adapter in '{}' was made for another base: it holds '{}', which no LoRA target of model '{}' has",
                 dir, t.name, spec.name);
}

void load_run_weights(const RunConfig& config, Executor& ex, const ModelSpec& spec, TensorStaging& staging,
                      bool resuming) {
  // OLoRA / PiSSA rewrite the base and start the adapters (an adapter's file then replaces
  // them): a quantised base as it is quantised, a float one once loaded. A checkpoint to resume
  // holds the rewritten base and the magnitudes already.
  const bool starting = !resuming;
  BaseStart start(config.policy.lora, config.seed);
  BaseStart* start_at_load = starting ? &start : nullptr;
  if (config.load.empty()) {
    initialize_parameters(ex, spec, config.seed, staging, {}, start_at_load);
  } else {
    load_weights(config.load, ex, spec, staging, start_at_load);
    // A base checkpoint has no adapters: they start as PEFT starts them.
    initialize_parameters(ex, spec, config.seed, staging, [](const ParamEntry& e) { return is_lora_adapter(e.name); },
                          start_at_load);
  }
  if (starting) start.start(ex, staging);
  // DoRA's magnitudes: from the base weights, unless an adapter or a checkpoint brings them.
  if (config.load_adapter.empty() && starting) initialize_dora_magnitudes(ex, staging);
  if (!config.load_adapter.empty()) load_adapter(config.load_adapter, ex, spec, config.policy.lora, staging);
}

void load_inference_weights(const RunConfig& config, Executor& ex, const ModelSpec& spec, TensorStaging& staging,
                            std::ostream& log) {
  load_run_weights(config, ex, spec, staging, false);
  if (config.load.empty())
    log << fmt::format("no --load: model '{}' at its seeded initialisation (seed {})\n", spec.name, config.seed);
  if (!config.load_adapter.empty()) log << fmt::format("with the LoRA adapter from {}\n", config.load_adapter);
}

}  // namespace memfit
