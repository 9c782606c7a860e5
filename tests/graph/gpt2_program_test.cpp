// The GPT-2 training program against closed-form numbers: parameter counts (HF's published
// 124,439,808 for gpt2), activation bytes kept per layer (the tensor list of Korthikanti et
// al. 2022 in fp32, without dropout), and the structure autodiff must produce.
#include <gtest/gtest.h>

#include <map>

#include "core/error.hpp"
#include "graph/training_program.hpp"
#include "plan/memory_plan.hpp"

namespace memfit {
namespace {

Policy small_policy(int64_t B, int64_t T) {
  Policy p;
  p.batch = B;
  p.seq = T;
  return p;
}

TEST(Gpt2Program, ParameterCountMatchesPublishedGpt2) {
  ModelSpec s = model_preset("gpt2");
  s.padded_vocab = s.vocab_size;  // HF's count has no padding rows
  EXPECT_EQ(s.parameter_count(), 124439808);
  const Program p = build_training_program(s, small_policy(1, 8), {});
  EXPECT_EQ(p.parameter_count(), 124439808);
  // Padding to a multiple of 64 adds 47 rows of 768.
  const ModelSpec padded = model_preset("gpt2");
  EXPECT_EQ(padded.padded_vocab, 50304);
  EXPECT_EQ(build_training_program(padded, small_policy(1, 8), {}).parameter_count(), 124439808 + 47 * 768);
}

TEST(Gpt2Program, PresetSizesMatchPublishedCounts) {
  // Published parameter counts (unpadded vocabulary, tied embeddings).
  const std::map<std::string, int64_t> published = {
      {"gpt2-medium", 354823168}, {"gpt2-large", 774030080}, {"gpt2-xl", 1557611200}};
  for (const auto& [name, count] : published) {
    ModelSpec s = model_preset(name);
    s.padded_vocab = s.vocab_size;
    EXPECT_EQ(s.parameter_count(), count) << name;
  }
}

// Korthikanti et al. 2022 list what one layer keeps for backward. Without dropout, and in
// fp32 (4 bytes per element instead of 2): the two layernorm inputs (2sbh), QKV input (sbh),
// Q, K, V (3sbh), softmax output (a s^2 b), attention output before the projection (sbh), MLP
// input (sbh), GELU input (4sbh) and output (4sbh): 16 sbh + a s^2 b elements. memfit also
// keeps each layernorm's mean and rstd (4 sb floats), which the paper folds away.
TEST(Gpt2Program, ActivationsPerLayerMatchKorthikantiTensorList) {
  for (auto [B, T] : {std::pair<int64_t, int64_t>{2, 64}, {4, 256}}) {
    const ModelSpec s = model_preset("gpt2-tiny");
    const Program p = build_training_program(s, small_policy(B, T), {});
    const MemoryPlan plan = plan_memory(p);
    int classifier = -1;
    for (int i = 0; i < int(p.ops().size()); ++i)
      if (p.op(i).kind == OpKind::classifier) classifier = i;
    ASSERT_GE(classifier, 0);
    const int64_t h = s.n_embd, a = s.n_head;
    const uint64_t expected = uint64_t(4 * (16 * T * B * h + a * T * T * B) + 4 * 4 * T * B);
    for (int64_t layer = 0; layer < s.n_layer; ++layer) {
      uint64_t kept = 0;
      for (size_t id = 0; id < p.tensors().size(); ++id) {
        const TensorDesc& t = p.tensors()[id];
        if (t.layer == layer && t.category == Category::activations && plan.tensors[id].live.contains(classifier))
          kept += t.bytes();
      }
      EXPECT_EQ(kept, expected) << "layer " << layer << " B " << B << " T " << T;
    }
  }
}

TEST(Gpt2Program, EveryParameterGetsOneGradientWrittenFirstThenAccumulated) {
  const Program p = build_training_program(model_preset("gpt2-tiny"), small_policy(2, 16), {});
  for (const ParamEntry& e : p.params()) {
    ASSERT_NE(e.grad, kNoTensor) << e.name;
    EXPECT_EQ(p.tensor(e.grad).category, Category::gradients);
    EXPECT_EQ(p.tensor(e.grad).lifetime, Lifetime::transient);
    std::vector<WriteMode> writes;
    for (const Op& op : p.ops())
      for (size_t j = 0; j < op.outputs.size(); ++j)
        if (op.outputs[j] == e.grad && op.kind != OpKind::adamw) writes.push_back(op.modes[j]);
    ASSERT_FALSE(writes.empty()) << e.name;
    EXPECT_EQ(writes[0], WriteMode::overwrite) << e.name;
    for (size_t i = 1; i < writes.size(); ++i) EXPECT_EQ(writes[i], WriteMode::accumulate) << e.name;
    // The tied embedding receives the classifier's and the embedding's contributions.
    if (e.name == "wte.weight") {
      EXPECT_EQ(writes.size(), 2u);
    }
  }
}

TEST(Gpt2Program, AccumulationMakesGradientsPersistentAndRepeatsTheMicroSection) {
  Policy pol = small_policy(2, 16);
  pol.grad_accum = 4;
  const Program p = build_training_program(model_preset("gpt2-tiny"), pol, {});
  ASSERT_NE(p.find_section("micro"), nullptr);
  EXPECT_EQ(p.find_section("micro")->repeat, 4);
  for (const ParamEntry& e : p.params()) {
    EXPECT_EQ(p.tensor(e.grad).lifetime, Lifetime::persistent);
    for (const Op& op : p.ops())
      for (size_t j = 0; j < op.outputs.size(); ++j)
        if (op.outputs[j] == e.grad && op.kind != OpKind::adamw) {
          EXPECT_NE(op.modes[j], WriteMode::overwrite) << e.name;
          break;
        }
  }
  const auto& c = std::get<ClassifierAttrs>(p.op(int(std::find_if(p.ops().begin(), p.ops().end(), [](const Op& o) {
                                                       return o.kind == OpKind::classifier;
                                                     }) - p.ops().begin())).attrs);
  EXPECT_FLOAT_EQ(c.grad_scale, 1.0f / (2 * 16 * 4));
}

TEST(Gpt2Program, RefusesWhatItCannotExpressWithTheFieldNamed) {
  const ModelSpec s = model_preset("gpt2-tiny");
  auto message = [&](Policy p) {
    try {
      build_training_program(s, p, {});
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  Policy p = small_policy(2, 16);
  p.seq = 257;
  EXPECT_NE(message(p).find("exceeds the context"), std::string::npos) << message(p);
  p = small_policy(2, 16);
  p.batch = 0;
  EXPECT_NE(message(p).find("batch"), std::string::npos);
}

}  // namespace
}  // namespace memfit
