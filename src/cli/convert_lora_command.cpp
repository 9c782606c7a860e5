#include "cli/convert_lora_command.hpp"

#include <cmath>
#include <deque>
#include <filesystem>
#include <fstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli/peft_adapter_reading.hpp"
#include "core/error.hpp"
#include "io/safetensors_shards.hpp"
#include "train/adapter_files.hpp"
#include "train/lora_base_start.hpp"
#include "train/run_config.hpp"
#include "train/weights.hpp"

namespace memfit::cli {

namespace fs = std::filesystem;

ConvertLoraCommand::ConvertLoraCommand(CLI::App& app)
    : AdapterFileCommand(app, "the original base weights the adapter was started from",
                         "a PEFT adapter directory whose init_lora_weights is olora or pissa",
                         "the directory to write (adapter_config.json + adapter_model.safetensors)") {}

int ConvertLoraCommand::run(std::ostream& log) const {
  const ModelSpec spec = resolve_model(model_);
  LoraPolicy lora;
  apply_adapter_config(adapter_, lora);
  MEMFIT_CHECK(rewrites_base(lora), "convert-lora", "the adapter in '{}' started as init_lora_weights {}: it is a "
               "LoRA adapter of its base already", adapter_, lora_init_name(lora));
  MEMFIT_CHECK(!lora.dora, "convert-lora", "the adapter in '{}' is DoRA: its update is not B A alone", adapter_);
  MEMFIT_CHECK(!lora.rslora || (lora.rank_pattern.empty() && lora.alpha_pattern.empty()), "convert-lora",
               "rsLoRA with rank_pattern or alpha_pattern: doubling the ranks changes the scales (PEFT refuses it too)");
  const SafetensorsShards base(load_);
  const SafetensorsReader adapter((fs::path(adapter_) / "adapter_model.safetensors").string());
  std::map<std::string, Adapter> modules = adapter_modules(adapter, adapter_, false);
  // Every output tensor's values, held until the file is written (an adapter is small); a
  // deque keeps their addresses as it grows.
  std::deque<std::vector<float>> values;
  std::vector<SafetensorsTensor> tensors;
  auto add = [&](const std::string& name, Shape shape, std::vector<float> v) {
    tensors.push_back({name, DType::f32, std::move(shape), values.emplace_back(std::move(v)).data()});
  };
  auto read = [&](const std::string& name) {
    const SafetensorsEntry& e = *adapter.find(name);
    std::vector<float> v(static_cast<size_t>(e.shape.numel()));
    adapter.read_f32(name, e.shape, v.data());
    return std::pair{e.shape, std::move(v)};
  };
  for (const SafetensorsShards::Located& t : base.tensors()) {
    const std::string name = wrapped_name(spec, t.entry->name);
    if (!name.ends_with(".weight")) continue;
    const std::string module = name.substr(0, name.size() - 7);
    const auto it = modules.find(module);
    if (it == modules.end()) continue;
    it->second.used = true;
    const auto [as, a] = read(it->second.a);
    const auto [bs, b] = read(it->second.b);
    const int64_t r = as[0], in = as[1], out = bs[0];
    std::vector<float> w(static_cast<size_t>(t.entry->shape.numel()));
    t.shard->read_f32(t.entry->name, t.entry->shape, w.data());
    const bool conv1d = spec.arch == Arch::gpt2 && is_conv1d_weight(name);
    const LowRankFactors f0 = start_factors_of(w, t.entry->shape, r, lora.scale_of(module), lora, conv1d, name);
    MEMFIT_CHECK(int64_t(f0.a.size()) == r * in && int64_t(f0.b.size()) == out * r, "adapter",
                 "the adapter was made for another base: '{}' is {} x {} in the adapter", module, out, in);
    std::vector<float> a2(a);  // [A; A0]
    a2.insert(a2.end(), f0.a.begin(), f0.a.end());
    std::vector<float> b2(static_cast<size_t>(out * 2 * r));  // [B, -B0]
    for (int64_t o = 0; o < out; ++o)
      for (int64_t k = 0; k < r; ++k) {
        b2[size_t(o * 2 * r + k)] = b[size_t(o * r + k)];
        b2[size_t(o * 2 * r + r + k)] = -f0.b[size_t(o * r + k)];
      }
    add(it->second.a, Shape{2 * r, in}, std::move(a2));
    add(it->second.b, Shape{out, 2 * r}, std::move(b2));
  }
  for (const auto& [module, ad] : modules)
    MEMFIT_CHECK(ad.used, "adapter", "the adapter in '{}' was made for another base: {} has no weight '{}.weight'",
                 adapter_, base.description(), module);
  for (const auto& [base_name, peft_name] : replaced_tensors(adapter)) {  // trained whole: as they are
    auto [shape, v] = read(peft_name);
    add(peft_name, shape, std::move(v));
  }
  nlohmann::json config;
  {
    std::ifstream in(fs::path(adapter_) / "adapter_config.json");
    config = nlohmann::json::parse(in);
  }
  config["init_lora_weights"] = true;
  config["r"] = 2 * lora.rank;
  // Doubled as PEFT doubles them (integers stay integers).
  auto twice = [](const nlohmann::json& v) {
    return v.is_number_integer() ? nlohmann::json(2 * v.get<int64_t>()) : nlohmann::json(2 * v.get<double>());
  };
  config["lora_alpha"] = lora.rslora ? nlohmann::json(config["lora_alpha"].get<double>() * std::sqrt(2.0))
                                     : twice(config["lora_alpha"]);
  for (const char* key : {"rank_pattern", "alpha_pattern"})
    if (config.contains(key) && config[key].is_object())
      for (auto& [k, v] : config[key].items()) v = twice(v);
  std::error_code ec;
  fs::create_directories(out_, ec);
  MEMFIT_CHECK(!ec, "convert-lora", "cannot create directory '{}': {}", out_, ec.message());
  write_safetensors((fs::path(out_) / "adapter_model.safetensors").string(), tensors,
                    {{"format", "pt"}, {"producer", "memfit convert-lora"}});
  const fs::path path = fs::path(out_) / "adapter_config.json", tmp = fs::path(out_) / "adapter_config.json.tmp";
  {
    std::ofstream out(tmp);
    out << config.dump(2) << "\n";
    MEMFIT_CHECK(out.good(), "convert-lora", "cannot write '{}'", tmp.string());
  }
  fs::rename(tmp, path);
  log << fmt::format("convert-lora: {} modules of the {} adapter in {} as rank-{} LoRA of the original base, "
                     "[B, -B0] [A; A0] with lora_alpha {}, into {}\n", modules.size(), lora_init_name(lora), adapter_,
                     2 * lora.rank, config["lora_alpha"].dump(), out_);
  return 0;
}

}  // namespace memfit::cli
