#include "cli/merge_lora_command.hpp"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include <fmt/format.h>

#include "core/error.hpp"
#include "io/hf_config.hpp"
#include "io/safetensors.hpp"
#include "io/safetensors_shards.hpp"
#include "cli/peft_adapter_reading.hpp"
#include "train/adapter_files.hpp"
#include "train/lora_base_start.hpp"
#include "train/lora_start_factors.hpp"
#include "train/run_config.hpp"
#include "train/weights.hpp"

namespace memfit::cli {

namespace fs = std::filesystem;

namespace {

constexpr uint64_t kMaxShardBytes = 5'000'000'000;

// w ([rows, cols] as the file stores it) += scale * B A, or its transpose for a Conv1D weight.
void merge_into(std::vector<float>& w, const Shape& shape, const std::vector<float>& a, const Shape& as,
                const std::vector<float>& b, const Shape& bs, double scale, bool conv1d, const std::string& name) {
  const int64_t r = as[0], in = as[1], out = bs[0];
  const Shape want = conv1d ? Shape{in, out} : Shape{out, in};
  MEMFIT_CHECK(bs[1] == r && shape == want, "adapter",
               "the adapter was made for another base: '{}' is [{}, {}] in the base, the adapter's B A is [{}, {}]{}",
               name, shape[0], shape[1], out, in, conv1d ? " (Conv1D: stored [in, out])" : "");
  for (int64_t o = 0; o < out; ++o)
    for (int64_t i = 0; i < in; ++i) {
      double d = 0;
      for (int64_t k = 0; k < r; ++k) d += double(b[size_t(o * r + k)]) * double(a[size_t(k * in + i)]);
      w[size_t(conv1d ? i * out + o : o * in + i)] += float(scale * d);
    }
}

// DoRA (PEFT's merge): each output row of the merged W + scale B A (a column of a Conv1D
// weight) rescaled to its magnitude, m / ||row||.
void rescale_rows(std::vector<float>& w, const Shape& shape, const std::vector<float>& m, bool conv1d,
                  const std::string& name) {
  const int64_t out = conv1d ? shape[1] : shape[0], in = conv1d ? shape[0] : shape[1];
  MEMFIT_CHECK(int64_t(m.size()) == out, "adapter", "the adapter was made for another base: '{}' has {} output rows, "
               "its DoRA magnitude {}", name, out, m.size());
  auto at = [&](int64_t o, int64_t i) -> float& { return w[size_t(conv1d ? i * out + o : o * in + i)]; };
  for (int64_t o = 0; o < out; ++o) {
    double sum = 0;
    for (int64_t i = 0; i < in; ++i) sum += double(at(o, i)) * double(at(o, i));
    const float factor = float(double(m[size_t(o)]) / std::sqrt(sum));
    for (int64_t i = 0; i < in; ++i) at(o, i) *= factor;
  }
}

}  // namespace

MergeLoraCommand::MergeLoraCommand(CLI::App& app)
    : AdapterFileCommand(app, "the base weights: a .safetensors file, an HF model directory or a sharded index",
                         "a PEFT LoRA adapter directory (adapter_config.json, adapter_model.safetensors), as memfit "
                         "train --save writes for a LoRA run",
                         "the directory to write (model.safetensors + config.json)") {}

// OLoRA / PiSSA: the adapter was trained on W - scale B0 A0 (cli/peft_adapter_reading.hpp).
void subtract_start(std::vector<float>& w, const Shape& shape, int64_t rank, double scale, const LoraPolicy& lora,
                    bool conv1d, const std::string& name) {
  const LowRankFactors f = start_factors_of(w, shape, rank, scale, lora, conv1d, name);
  const int64_t out = conv1d ? shape[1] : shape[0], in = conv1d ? shape[0] : shape[1];
  if (!conv1d) return subtract_low_rank(w, 0, out, in, f, scale);
  std::vector<float> rows(w.size());  // a Conv1D weight [in, out] as [out, in], then back
  for (int64_t o = 0; o < out; ++o)
    for (int64_t i = 0; i < in; ++i) rows[size_t(o * in + i)] = w[size_t(i * out + o)];
  subtract_low_rank(rows, 0, out, in, f, scale);
  for (int64_t o = 0; o < out; ++o)
    for (int64_t i = 0; i < in; ++i) w[size_t(i * out + o)] = rows[size_t(o * in + i)];
}

int MergeLoraCommand::run(std::ostream& log) const {
  const ModelSpec spec = resolve_model(model_);
  LoraPolicy lora;
  apply_adapter_config(adapter_, lora);
  const SafetensorsShards base(load_);
  const SafetensorsReader adapter((fs::path(adapter_) / "adapter_model.safetensors").string());
  std::map<std::string, Adapter> modules = adapter_modules(adapter, adapter_, lora.dora);
  const std::map<std::string, std::string> replaced = replaced_tensors(adapter);
  std::set<std::string> replaced_used;
  std::vector<SafetensorsTensor> tensors;
  int merged = 0;
  for (const SafetensorsShards::Located& t : base.tensors()) {
    const SafetensorsEntry& e = *t.entry;
    MEMFIT_CHECK(e.supported && dtype_is_float(e.dtype), "safetensors", "{}: tensor '{}' is {}, not a float type",
                 base.description(), e.name, e.file_dtype);
    const std::string name = wrapped_name(spec, e.name);
    Adapter* ad = nullptr;
    if (name.ends_with(".weight"))
      if (auto it = modules.find(name.substr(0, name.size() - 7)); it != modules.end()) ad = &it->second;
    const bool conv1d = ad && spec.arch == Arch::gpt2 && is_conv1d_weight(name);
    if (ad) ad->used = true, ++merged;
    const SafetensorsReader* lora_file = &adapter;
    if (auto it = replaced.find(name); it != replaced.end()) {  // trained with the adapter: its value wins
      const SafetensorsEntry& trained = *adapter.find(it->second);
      MEMFIT_CHECK(trained.shape == e.shape, "adapter", "the adapter was made for another base: '{}' has {} elements "
                   "in the adapter, {} in the base", it->second, trained.shape.numel(), e.shape.numel());
      replaced_used.insert(name);
      tensors.push_back({name, DType::f32, e.shape, nullptr, [lora_file, &trained](const auto& emit) {
                           std::vector<float> v(size_t(trained.shape.numel()));
                           lora_file->read_f32(trained.name, trained.shape, v.data());
                           emit(std::as_bytes(std::span<const float>(v)));
                         }});
      continue;
    }
    const SafetensorsReader* shard = t.shard;
    tensors.push_back({name, DType::f32, e.shape, nullptr,
                       [shard, &e, ad, lora_file, scale = ad ? lora.scale_of(name.substr(0, name.size() - 7)) : 0.0,
                        conv1d, name, &lora](const auto& emit) {
                         std::vector<float> w(size_t(e.shape.numel()));
                         shard->read_f32(e.name, e.shape, w.data());
                         if (ad) {
                           const SafetensorsEntry& a = *lora_file->find(ad->a);
                           const SafetensorsEntry& b = *lora_file->find(ad->b);
                           std::vector<float> av(size_t(a.shape.numel())), bv(size_t(b.shape.numel()));
                           lora_file->read_f32(a.name, a.shape, av.data());
                           lora_file->read_f32(b.name, b.shape, bv.data());
                           if (rewrites_base(lora)) subtract_start(w, e.shape, a.shape[0], scale, lora, conv1d, name);
                           merge_into(w, e.shape, av, a.shape, bv, b.shape, scale, conv1d, name);
                           if (!ad->magnitude.empty()) {
                             const SafetensorsEntry& m = *lora_file->find(ad->magnitude);
                             std::vector<float> mv(size_t(m.shape.numel()));
                             lora_file->read_f32(m.name, m.shape, mv.data());
                             rescale_rows(w, e.shape, mv, conv1d, name);
                           }
                         }
                         emit(std::as_bytes(std::span<const float>(w)));
                       }});
  }
  for (const auto& [module, ad] : modules)
    MEMFIT_CHECK(ad.used, "adapter", "the adapter in '{}' was made for another base: {} has no weight '{}.weight'",
                 adapter_, base.description(), module);
  for (const auto& [name, peft_name] : replaced)
    MEMFIT_CHECK(replaced_used.count(name) > 0, "adapter", "the adapter in '{}' was made for another base: {} has no "
                 "tensor '{}' for its '{}'", adapter_, base.description(), name, peft_name);
  std::error_code ec;
  fs::create_directories(out_, ec);
  MEMFIT_CHECK(!ec, "merge-lora", "cannot create directory '{}': {}", out_, ec.message());
  const auto files =
      write_safetensors_shards(out_, tensors, kMaxShardBytes, {{"format", "pt"}, {"producer", "memfit"}});
  {
    std::ofstream config(fs::path(out_) / "config.json");
    config << hf_config(spec).dump(2) << "\n";
    MEMFIT_CHECK(config.good(), "merge-lora", "cannot write '{}/config.json'", out_);
  }
  log << fmt::format("merge-lora: {} of {} weights merged with {}(lora_alpha / {}) B A = ({} / {}) B A{}{}{} into {} "
                     "({} file{})\n", merged, tensors.size(),
                     rewrites_base(lora) ? fmt::format("the {} start's residual and ", lora_init_name(lora)) : "",
                     lora.rslora ? "sqrt(r)" : "r", lora.alpha,
                     lora.rslora ? fmt::format("sqrt({})", lora.rank) : std::to_string(lora.rank),
                     lora.rank_pattern.empty() && lora.alpha_pattern.empty() ? "" : " (rank_pattern, alpha_pattern: "
                     "per module)",
                     lora.dora ? ", each output row then rescaled to its DoRA magnitude" : "",
                     replaced.empty() ? "" : fmt::format(", {} tensors trained whole with the adapter", replaced.size()), out_,
                     files.size(), files.size() == 1 ? "" : "s");
  return 0;
}

}  // namespace memfit::cli
