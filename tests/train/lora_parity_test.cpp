// memfit's LoRA against PEFT on the committed fixtures (tools/make_lora_fixtures.py): the HF
// base of llama_tiny_torch / gpt2_tiny_torch loaded as --load does, PEFT's adapter (seeded
// nonzero B, so A's gradients are not zero) as --load-adapter does, then
// - the loss to 1e-5 relative and every adapter gradient to 1e-4 of its largest element;
// - three AdamW steps (lr 1e-3, decay 0.1 on the adapter matrices) follow PEFT's losses, and
//   the adapter memfit saves after them equals PEFT's after them (1e-5 of the largest element);
// - the saved directory has the PEFT fixture's tensor names, shapes and LoRA settings, and
//   reloading it gives the loss after the steps bit for bit.
// That PEFT loads memfit's adapter (and transformers the merged weights) is checked by
// tools/check_peft_roundtrip.py, which needs PyTorch and is not a test.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>

#include <unistd.h>

#include <nlohmann/json.hpp>

#include "core/error.hpp"
#include "graph/training_program.hpp"
#include "io/hf_config.hpp"
#include "io/safetensors.hpp"
#include "kernels/backend.hpp"
#include "support/adapter_run.hpp"
#include "support/paths.hpp"
#include "support/run_cli.hpp"
#include "support/tensor_values.hpp"
#include "graph/lora.hpp"
#include "train/adapter_files.hpp"
#include "train/init.hpp"
#include "train/weights.hpp"

namespace memfit {
namespace {

namespace fs = std::filesystem;

// A LoRA run of a fixture's base with the adapter in `adapter_dir` (AdamW as the fixtures').
struct LoraRun : test::AdapterRun {
  LoraRun(const std::string& base, const std::string& adapter_dir)
      : AdapterRun(test::fixture_path(base), adapter_dir, fixture_policy()) {}
  static Policy fixture_policy() {
    Policy pol;
    pol.adamw = AdamWConfig{0.9f, 0.999f, 1e-8f, 0.1f};
    return pol;
  }
};

// Largest |a - b| over the largest |b|.
double normalised_error(std::span<const float> a, std::span<const float> b) {
  double err = 0, scale = 0;
  for (size_t i = 0; i < b.size(); ++i) {
    err = std::max(err, double(std::fabs(a[i] - b[i])));
    scale = std::max(scale, double(std::fabs(b[i])));
  }
  return scale > 0 ? err / scale : (err > 0 ? INFINITY : 0);
}

std::vector<float> read_all(const SafetensorsReader& r, const std::string& name) {
  const SafetensorsEntry* e = r.find(name);
  EXPECT_NE(e, nullptr) << name;
  if (!e) return {};
  std::vector<float> v(size_t(e->shape.numel()));
  r.read_f32(name, e->shape, v.data());
  return v;
}

// "llama_extras": rsLoRA and modules_to_save (o_proj, a target too, and every norm) on llama's base;
// "llama_select": exclude_modules (k_proj, up_proj) and layers_to_transform (layer 1 only);
// "llama_patterns": rank_pattern (q_proj 8, layer 1's down_proj 2) and alpha_pattern (v_proj 32);
// "llama_dora": DoRA (use_dora) on q, v (pieces of memfit's fused q/k/v), o and down;
// "gpt2_dora": DoRA on GPT-2's biased Conv1D c_attn and c_fc (their biases frozen).
std::string base_of(const std::string& family) { return family.substr(0, family.find('_')); }

class LoraParity : public ::testing::TestWithParam<const char*> {
 protected:
  std::string family = GetParam();
  std::string base = base_of(family) + "_tiny_torch";
  std::string adapter = test::fixture_path("lora_" + family + "_tiny_torch");
  SafetensorsReader expected{adapter + "/expected.safetensors"};
  LoraRun run{base, adapter};
  std::vector<std::string> saved_whole = lora_modules_to_save(run.compiled.program, run.lora);
  // What `r` trains: the adapters, modules_to_save's parameters, and with bias "all" every bias.
  bool trained(const LoraRun& r, const std::string& param) const {
    return is_lora_adapter(param) || std::count(saved_whole.begin(), saved_whole.end(), param) > 0 ||
           (r.lora.bias == LoraBias::all && param.ends_with(".bias"));
  }
  std::string out = (fs::temp_directory_path() / ("memfit_lora_parity_" + family + "_" +
                                                  std::to_string(::getpid()))).string();
  ~LoraParity() override { fs::remove_all(out); }

  // One micro-step of `r` against the fixture's `prefix`loss and `prefix`grad.<tensor>: the loss
  // to 1e-5 relative, every trained tensor's gradient to 1e-4 of its largest element.
  void expect_step_matches(LoraRun& r, const std::string& prefix) {
    std::vector<float> ref(1);
    expected.read_f32(prefix + "loss", Shape{}, ref.data());
    const float loss = r.micro_step();
    EXPECT_NEAR(loss, ref[0], 1e-5 * std::fabs(ref[0]));
    std::printf("%sloss: memfit %.7f, PEFT %.7f\n", prefix.c_str(), loss, ref[0]);
    int compared = 0;
    double worst = 0;
    for (const ParamEntry& e : r.compiled.program.params()) {
      if (e.grad == kNoTensor) {
        EXPECT_FALSE(trained(r, e.name)) << e.name;
        continue;
      }
      ASSERT_TRUE(trained(r, e.name)) << e.name << " is trainable";
      std::vector<float> ours = test::tensor_values<float>(*r.ex, e.grad);
      std::string name = prefix + "grad." + peft_tensor_name(r.spec, e.name);
      if (!expected.find(name) && name.ends_with(".bias"))  // an adapted layer's own bias, as PEFT names it
        name = name.substr(0, name.size() - 5) + ".base_layer.bias";
      const std::vector<float> theirs = read_all(expected, name);
      // An output head holds the padded vocabulary's rows too: HF's are the first.
      if (e.name == "lm_head.weight" && ours.size() > theirs.size()) ours.resize(theirs.size());
      ASSERT_EQ(ours.size(), theirs.size()) << e.name;
      const double err = normalised_error(ours, theirs);
      EXPECT_LE(err, 1e-4) << e.name;
      worst = std::max(worst, err);
      ++compared;
    }
    int grads = 0;
    for (const SafetensorsEntry& e : expected.entries()) grads += e.name.starts_with(prefix + "grad.");
    EXPECT_EQ(compared, grads);
    EXPECT_GT(compared, 0);
    std::printf("%d adapter gradients, largest normalised error %.3g\n", compared, worst);
  }
};

TEST_P(LoraParity, LossAndEveryAdapterGradientMatchPeft) {
  expect_step_matches(run, "");
  EXPECT_EQ(saved_whole.size(), family == "llama_extras" ? 7u : 0u);  // 2 o_proj, norm, 2 x 2 layer norms
}

// DoRA with lora_dropout: PEFT's form, where the dropped input gets its own base product
// (graph/lora.cpp), against PEFT run on memfit's own masks (tools/make_lora_fixtures.py draws
// them as core/dropout_mask.hpp does, for seed 0, step 1, micro-step 0). Llama's q and v are
// windows of the fused q/k/v weight; GPT-2's layers have biases, which only the undropped
// product adds.
class DoraParity : public LoraParity {
 protected:
  // The fixture's adapter with its adapter_config.json's `key` set to `value`, in `out`.
  std::string adapter_with(const std::string& key, const nlohmann::json& value) {
    fs::create_directories(out);
    fs::copy_file(adapter + "/adapter_model.safetensors", out + "/adapter_model.safetensors");
    nlohmann::json config = nlohmann::json::parse(std::ifstream(adapter + "/adapter_config.json"));
    config[key] = value;
    std::ofstream(out + "/adapter_config.json") << config.dump();
    return out;
  }
};

TEST_P(DoraParity, WithDropoutMatchesPeftOnTheSameMasks) {
  float p = 0;
  expected.read_f32("dropout_p", Shape{}, &p);
  LoraRun dropped(base, adapter_with("lora_dropout", p));
  ASSERT_EQ(float(dropped.lora.dropout), p);
  expect_step_matches(dropped, "dropout.");
  float plain = 0;
  expected.read_f32("loss", Shape{}, &plain);
  EXPECT_GT(std::fabs(dropped.ex->read_scalar<float>(dropped.compiled.program.find_tensor(kLoss)) - plain),
            1e-5 * plain);  // the masks did drop something
}

TEST_P(LoraParity, ThreeAdamWStepsAndTheSavedAdapterMatchPeft) {
  std::vector<float> ref(4);
  expected.read_f32("losses_adamw", Shape{4}, ref.data());
  const std::vector<float> losses = run.optimizer_steps(3, 1e-3f);
  for (size_t i = 0; i < losses.size(); ++i) EXPECT_NEAR(losses[i], ref[i], 1e-5 * ref[i]) << "before update " << i + 1;
  const float after = run.micro_step();
  EXPECT_NEAR(after, ref[3], 1e-5 * ref[3]) << "after three updates";
  std::printf("after 3 updates: memfit %.7f, PEFT %.7f\n", after, ref[3]);

  save_adapter(out, *run.ex, run.spec, run.lora, base, run.staging);
  const SafetensorsReader saved(out + "/adapter_model.safetensors"), peft(adapter + "/adapter_model.safetensors");
  // The names and shapes of PEFT's own file, and the values PEFT reached.
  ASSERT_EQ(saved.entries().size(), peft.entries().size());
  double worst = 0;
  int noise_level = 0;
  for (const SafetensorsEntry& e : peft.entries()) {
    const SafetensorsEntry* s = saved.find(e.name);
    ASSERT_NE(s, nullptr) << e.name;
    EXPECT_EQ(s->shape, e.shape) << e.name;
    EXPECT_EQ(s->file_dtype, "F32") << e.name;
    // Adam moves an element by about lr a step whatever its gradient's size, so an element whose
    // gradient is at the level of the gradients' agreement (1e-4 of the largest) moves as
    // rounding decides: those are held to the 3 lr three steps can move them, the rest to 1e-5.
    const std::vector<float> ours = read_all(saved, e.name), theirs = read_all(expected, "after." + e.name);
    const std::vector<float> grad = read_all(expected, "grad." + e.name);
    double scale = 0, largest_grad = 0, err = 0;
    for (size_t i = 0; i < theirs.size(); ++i) {
      scale = std::max(scale, double(std::fabs(theirs[i])));
      largest_grad = std::max(largest_grad, double(std::fabs(grad[i])));
    }
    for (size_t i = 0; i < theirs.size(); ++i) {
      const double d = std::fabs(double(ours[i]) - double(theirs[i]));
      if (std::fabs(grad[i]) < 1e-4 * largest_grad) {
        EXPECT_LE(d, 3e-3) << e.name << " element " << i;
        ++noise_level;
      } else {
        err = std::max(err, d / scale);
      }
    }
    EXPECT_LE(err, 1e-5) << e.name;
    worst = std::max(worst, err);
  }
  std::printf("adapter after 3 updates: largest normalised error %.3g (%d elements with gradients below 1e-4 of "
              "their tensor's largest held to 3 lr)\n", worst, noise_level);
  // The LoRA settings of PEFT's adapter_config.json.
  const auto config = [](const std::string& dir) {
    std::ifstream in(dir + "/adapter_config.json");
    return nlohmann::json::parse(in);
  };
  const nlohmann::json ours = config(out), theirs = config(adapter);
  for (const char* key : {"peft_type", "task_type", "r", "lora_alpha", "lora_dropout", "bias", "fan_in_fan_out",
                          "use_dora", "use_rslora", "base_model_name_or_path"})
    EXPECT_EQ(ours.at(key), theirs.at(key)) << key;
  const auto names = [](const nlohmann::json& j, const char* key) {
    return j.at(key).is_null() ? std::set<std::string>{} : j.at(key).get<std::set<std::string>>();
  };
  EXPECT_EQ(names(ours, "target_modules"), names(theirs, "target_modules"));
  EXPECT_EQ(names(ours, "modules_to_save"), names(theirs, "modules_to_save"));
  EXPECT_EQ(names(ours, "exclude_modules"), names(theirs, "exclude_modules"));
  EXPECT_EQ(ours.at("layers_to_transform"), theirs.at("layers_to_transform"));
  EXPECT_EQ(ours.at("rank_pattern"), theirs.at("rank_pattern"));
  EXPECT_EQ(ours.at("alpha_pattern"), theirs.at("alpha_pattern"));
  const auto list = [](const nlohmann::json& v) { return v.is_string() ? nlohmann::json::array({v}) : v; };
  EXPECT_EQ(list(ours.at("layers_pattern")), list(theirs.at("layers_pattern")));

  // Reloaded, the saved adapter gives the loss after the steps exactly.
  LoraRun reloaded(base, out);
  const float again = reloaded.micro_step();
  EXPECT_EQ(again, after);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, LoraParity, ::testing::Values("llama", "gpt2", "llama_extras", "llama_select",
                                                                       "llama_patterns", "llama_dora", "gpt2_dora"),
                         [](const auto& info) { return std::string(info.param); });

// DoRA with bias "all" (GPT-2's c_attn and c_fc are biased): a trained bias's gradient is dy,
// part through the rescaled product and part past it (graph/autodiff.cpp).
class DoraBiasParity : public DoraParity {};

TEST_P(DoraBiasParity, TrainedBiasesMatchPeft) {
  // PEFT's bias="all" adapter also holds every bias (saved as the base's: they have not trained).
  const std::string dir = adapter_with("bias", "all");
  const SafetensorsReader weights(test::fixture_path(base) + "/model.safetensors"), lora(adapter + "/adapter_model.safetensors");
  std::vector<std::vector<float>> values;
  std::vector<SafetensorsTensor> tensors;
  auto add = [&](const SafetensorsReader& from, const std::string& name, const std::string& as) {
    const SafetensorsEntry* e = from.find(name);
    ASSERT_NE(e, nullptr) << name;
    values.emplace_back(size_t(e->shape.numel()));
    from.read_f32(name, e->shape, values.back().data());
    tensors.push_back({as, DType::f32, e->shape, nullptr});
  };
  values.reserve(lora.entries().size() + weights.entries().size());
  for (const SafetensorsEntry& e : lora.entries()) add(lora, e.name, e.name);
  for (const SafetensorsEntry& e : weights.entries()) {
    if (!e.name.ends_with(".bias")) continue;
    const std::string module = "base_model.model." + e.name.substr(0, e.name.size() - 5);
    const bool adapted = lora.find(module + ".lora_A.weight") != nullptr;  // PEFT's name: the wrapped layer's
    add(weights, e.name, module + (adapted ? ".base_layer.bias" : ".bias"));
  }
  for (size_t i = 0; i < tensors.size(); ++i) tensors[i].data = values[i].data();
  write_safetensors(dir + "/adapter_model.safetensors", tensors);
  LoraRun biased(base, dir);
  ASSERT_EQ(biased.lora.bias, LoraBias::all);
  expect_step_matches(biased, "bias_all.");
}

INSTANTIATE_TEST_SUITE_P(Fixtures, DoraParity, ::testing::Values("llama_dora", "gpt2_dora"),
                         [](const auto& info) { return std::string(info.param); });
INSTANTIATE_TEST_SUITE_P(Fixtures, DoraBiasParity, ::testing::Values("gpt2_dora"),
                         [](const auto& info) { return std::string(info.param); });

TEST(LoraAdapterFiles, AnAdapterForAnotherBaseIsRefusedNamingTheFirstDifference) {
  // Same targets, other shapes: gpt2's adapter has no tensor of llama's names.
  const std::string dir = (fs::temp_directory_path() / ("memfit_lora_other_" + std::to_string(::getpid()))).string();
  fs::create_directories(dir);
  fs::copy_file(test::fixture_path("lora_llama_tiny_torch/adapter_config.json"), dir + "/adapter_config.json");
  // llama's adapter with one tensor of rank 4 replaced by a [4, 32] one (a base of hidden 32).
  const SafetensorsReader src(test::fixture_path("lora_llama_tiny_torch/adapter_model.safetensors"));
  std::vector<std::vector<float>> values;
  std::vector<SafetensorsTensor> tensors;
  values.reserve(src.entries().size());
  for (const SafetensorsEntry& e : src.entries()) {
    Shape shape = e.shape;
    if (e.name == "base_model.model.model.layers.1.mlp.up_proj.lora_A.weight") shape = Shape{4, 32};
    values.emplace_back(size_t(shape.numel()), 0.5f);
    tensors.push_back({e.name, DType::f32, shape, values.back().data()});
  }
  write_safetensors(dir + "/adapter_model.safetensors", tensors);
  try {
    LoraRun run("llama_tiny_torch", dir);
    FAIL() << "an adapter of another shape loaded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'base_model.model.model.layers.1.mlp.up_proj.lora_A.weight' is [4, 32] "
                                         "there, [4, 64] in model"),
              std::string::npos)
        << e.what();
  }
  fs::remove_all(dir);
}

// merge-lora's weights against W + scale B A computed here from the two files, for every
// tensor of the base (GPT-2's Conv1D weights stored [in, out]: the transpose added); scale is
// alpha / r = 8 / 4, alpha / sqrt(r) = 8 / 2 with rsLoRA, and with the patterns q_proj's 8 / 8,
// v_proj's 32 / 4 and layer 1's down_proj's 8 / 2 (the rank read from A's rows). A tensor the
// adapter trained whole (modules_to_save) is the adapter's. With DoRA each row of the sum is then
// rescaled to its magnitude (m / its norm).
TEST_P(LoraParity, MergeLoraWritesTheBasePlusTheScaledProduct) {
  const std::string base_dir = test::fixture_path(base);
  const test::CliResult r = test::run_memfit("merge-lora --model " + base_dir + " --load " + base_dir + " --adapter " +
                                             adapter + " --out " + out);
  ASSERT_EQ(r.status, 0) << r.out << r.err;
  const SafetensorsReader merged(out + "/model.safetensors"), w(base_dir + "/model.safetensors"),
      lora(adapter + "/adapter_model.safetensors");
  EXPECT_TRUE(fs::exists(out + "/config.json"));
  ASSERT_EQ(merged.entries().size(), w.entries().size());
  auto scale_of = [&](const std::string& module, int64_t rank) {
    if (family == "llama_extras") return 4.0f;
    if (family != "llama_patterns") return 2.0f;
    return (module.ends_with(".v_proj") ? 32.0f : 8.0f) / float(rank);
  };
  int changed = 0, replaced = 0;
  for (const SafetensorsEntry& e : w.entries()) {
    // The hub's gpt2 names drop "transformer."; merge-lora writes them with it, as --save does.
    const std::string name = base_of(family) == "gpt2" && !e.name.starts_with("transformer.") ? "transformer." + e.name : e.name;
    std::vector<float> want = read_all(w, e.name);
    const std::vector<float> after = read_all(merged, name);
    const std::string module = "base_model.model." + name.substr(0, name.size() - 7);
    if (lora.find("base_model.model." + name)) {
      want = read_all(lora, "base_model.model." + name);
      ++replaced;
    } else if (e.name.ends_with(".weight") && lora.find(module + ".lora_A.weight")) {
      const std::vector<float> a = read_all(lora, module + ".lora_A.weight");
      const std::vector<float> b = read_all(lora, module + ".lora_B.weight");
      const int64_t rank = lora.find(module + ".lora_A.weight")->shape[0];
      const int64_t in = int64_t(a.size()) / rank, outs = int64_t(b.size()) / rank;
      const float scale = scale_of(module, rank);
      const bool conv1d = base_of(family) == "gpt2";
      for (int64_t o = 0; o < outs; ++o)
        for (int64_t i = 0; i < in; ++i) {
          float d = 0;
          for (int64_t k = 0; k < rank; ++k) d += b[size_t(o * rank + k)] * a[size_t(k * in + i)];
          want[size_t(conv1d ? i * outs + o : o * in + i)] += scale * d;
        }
      if (family.ends_with("_dora")) {  // each output row of W + scale B A to its magnitude: m / ||row||
        const std::vector<float> m = read_all(lora, module + ".lora_magnitude_vector");
        ASSERT_EQ(int64_t(m.size()), outs) << module;
        auto at = [&](int64_t o, int64_t i) -> float& { return want[size_t(conv1d ? i * outs + o : o * in + i)]; };
        for (int64_t o = 0; o < outs; ++o) {
          double sum = 0;
          for (int64_t i = 0; i < in; ++i) sum += double(at(o, i)) * at(o, i);
          for (int64_t i = 0; i < in; ++i) at(o, i) *= float(m[size_t(o)] / std::sqrt(sum));
        }
      }
      ++changed;
    }
    ASSERT_EQ(after.size(), want.size()) << e.name;
    EXPECT_LE(normalised_error(after, want), 1e-6) << e.name;
  }
  EXPECT_EQ(changed, int(lora.entries().size() - saved_whole.size()) / (family.ends_with("_dora") ? 3 : 2));
  EXPECT_EQ(replaced, int(saved_whole.size()));
}

}  // namespace
}  // namespace memfit
