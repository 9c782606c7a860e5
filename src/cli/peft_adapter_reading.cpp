#include "cli/peft_adapter_reading.hpp"

#include <algorithm>

#include "core/error.hpp"
#include "train/lora_base_start.hpp"

namespace memfit::cli {

std::string wrapped_name(const ModelSpec& spec, const std::string& name) {
  const std::string prefix = spec.arch == Arch::gpt2 ? "transformer." : "model.";
  return name.starts_with(prefix) || name == "lm_head.weight" ? name : prefix + name;
}

constexpr std::string_view kMagnitude = ".lora_magnitude_vector";

bool is_adapter_factor(const std::string& name) {
  return name.ends_with(".lora_A.weight") || name.ends_with(".lora_B.weight") || name.ends_with(kMagnitude);
}

std::map<std::string, std::string> replaced_tensors(const SafetensorsReader& r) {
  static const std::string kWrapped = ".base_layer.bias";
  std::map<std::string, std::string> out;
  for (const SafetensorsEntry& e : r.entries()) {
    if (!e.name.starts_with(kPeftPrefix) || is_adapter_factor(e.name)) continue;
    std::string base = e.name.substr(kPeftPrefix.size());
    if (base.ends_with(kWrapped)) base = base.substr(0, base.size() - kWrapped.size()) + ".bias";
    out[base] = e.name;
  }
  return out;
}

std::map<std::string, Adapter> adapter_modules(const SafetensorsReader& r, const std::string& dir, bool dora) {
  std::map<std::string, Adapter> out;
  for (const SafetensorsEntry& e : r.entries()) {
    MEMFIT_CHECK(e.name.starts_with(kPeftPrefix), "adapter", "the adapter in '{}' holds '{}', which is not under "
                 "PEFT's names ({}...)", dir, e.name, kPeftPrefix);
    if (!is_adapter_factor(e.name)) continue;  // replaced_tensors
    if (e.name.ends_with(kMagnitude)) {
      out[e.name.substr(kPeftPrefix.size(), e.name.size() - kPeftPrefix.size() - kMagnitude.size())].magnitude = e.name;
      continue;
    }
    const bool a = e.name.ends_with(".lora_A.weight");
    const std::string module = e.name.substr(kPeftPrefix.size(), e.name.size() - kPeftPrefix.size() - 14);
    (a ? out[module].a : out[module].b) = e.name;
  }
  for (const auto& [module, ad] : out)
    MEMFIT_CHECK(!ad.a.empty() && !ad.b.empty(), "adapter", "the adapter in '{}' has only one of lora_A and lora_B "
                 "for '{}'", dir, module);
  for (const auto& [module, ad] : out)
    MEMFIT_CHECK(ad.magnitude.empty() == !dora, "adapter", "the adapter in '{}' {} a DoRA magnitude for '{}' but its "
                 "use_dora is {}", dir, dora ? "lacks" : "holds", module, dora);
  return out;
}

namespace {

// memfit's module name of a wrapped HF weight ("model.layers.0.mlp.up_proj.weight" ->
// "layers.0.mlp.up_proj"): what a training run's pissa_niter_N draw is seeded with.
std::string name_of_module(const std::string& weight) {
  const std::string module = weight.substr(0, weight.size() - std::string_view(".weight").size());
  for (std::string_view prefix : {"model.", "transformer."})
    if (module.starts_with(prefix)) return module.substr(prefix.size());
  return module;
}

}  // namespace

LowRankFactors start_factors_of(const std::vector<float>& w, const Shape& shape, int64_t rank, double scale,
                                const LoraPolicy& lora, bool conv1d, const std::string& name) {
  const int64_t out = conv1d ? shape[1] : shape[0], in = conv1d ? shape[0] : shape[1];
  const WeightRows read = [&](int64_t first, int64_t count, std::span<float> rows) {
    for (int64_t o = 0; o < count; ++o)
      for (int64_t i = 0; i < in; ++i)
        rows[size_t(o * in + i)] = w[size_t(conv1d ? i * out + first + o : (first + o) * in + i)];
  };
  const FactorShape s{out, in, rank, std::max<int64_t>(1, (int64_t(1) << 18) / in)};
  if (lora.init == LoraInit::olora) return olora_factors(s, read);
  MEMFIT_CHECK(lora.pissa_niter < 0 || lora.start_seed >= 0, "adapter",
               "a {} adapter without memfit_start_seed: its start was a draw of a run that did not record it (PEFT's "
               "own), so it cannot be computed again", lora_init_name(lora));
  return pissa_factors(s, scale, lora.pissa_niter, pissa_seed(uint64_t(lora.start_seed), name_of_module(name)), read,
                       name);
}

}  // namespace memfit::cli
