// The GPT-2 training program against closed-form numbers: parameter counts (HF's published
// 124,439,808 for gpt2), activation bytes kept per layer (the tensor list of Korthikanti et
// al. 2022 in fp32, without dropout), and the structure autodiff must produce.
#include <gtest/gtest.h>

#include <array>
#include <functional>
#include <map>

#include "core/error.hpp"
#include "graph/training_program.hpp"
#include "plan/memory_plan.hpp"
#include "support/plan_queries.hpp"
#include "kernels/backend.hpp"

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
  const Program p = build_training_program(s, small_policy(1, 8), {}, cpu_capabilities());
  EXPECT_EQ(p.parameter_count(), 124439808);
  // Padding to a multiple of 64 adds 47 rows of 768.
  const ModelSpec padded = model_preset("gpt2");
  EXPECT_EQ(padded.padded_vocab, 50304);
  EXPECT_EQ(build_training_program(padded, small_policy(1, 8), {}, cpu_capabilities()).parameter_count(), 124439808 + 47 * 768);
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
// keeps each layernorm's mean and rstd (4 sb floats), which the paper folds away. Per policy:
//   selective (attention core):  16 sbh            (the paper's 34 sbh bytes: its 5 a s^2 b term is
//                                                    softmax output, dropout mask and dropout output)
//   selective all three groups:  10 sbh            (minus GELU output 4sbh and layernorm outputs 2sbh)
//   full:                        1 sbh             (the block's input; the paper's 2 sbh bytes)
//   every:K:                     1 sbh in the last block of each K, 0 elsewhere
//   flash attention:             16 sbh + a s b    (y and the fp32 log-sum-exp instead of probs)
// Counted as the bytes of each layer's activations live at the start of backward (the
// classifier op), by the layer that produced them (a block's input belongs to the block before).
struct KeptCase {
  const char* recompute;
  AttentionKind attention;
  // elements per layer as coefficients of s*b*h, a*s*s*b, a*s*b, s*b; per layer index
  std::function<std::array<int64_t, 4>(int64_t layer, int64_t layers)> per_layer;
};

TEST(Gpt2Program, ActivationsPerLayerMatchKorthikantiTensorListForEveryPolicy) {
  using A = std::array<int64_t, 4>;
  const std::vector<KeptCase> cases = {
      {"none", AttentionKind::plain, [](int64_t, int64_t) { return A{16, 1, 0, 4}; }},
      {"selective", AttentionKind::plain, [](int64_t, int64_t) { return A{16, 0, 0, 4}; }},
      {"selective:attention,mlp_activation,norms", AttentionKind::plain, [](int64_t, int64_t) { return A{10, 0, 0, 4}; }},
      {"selective:gelu", AttentionKind::plain, [](int64_t, int64_t) { return A{12, 1, 0, 4}; }},
      {"full", AttentionKind::plain, [](int64_t, int64_t) { return A{1, 0, 0, 0}; }},
      {"every:2", AttentionKind::plain, [](int64_t l, int64_t L) { return (l % 2 == 1 || l == L - 1) ? A{1, 0, 0, 0} : A{}; }},
      {"every:3", AttentionKind::plain, [](int64_t l, int64_t L) { return (l % 3 == 2 || l == L - 1) ? A{1, 0, 0, 0} : A{}; }},
      {"none", AttentionKind::flash, [](int64_t, int64_t) { return A{16, 0, 1, 4}; }},
      {"selective", AttentionKind::flash, [](int64_t, int64_t) { return A{16, 0, 1, 4}; }},
      {"full", AttentionKind::flash, [](int64_t, int64_t) { return A{1, 0, 0, 0}; }},
  };
  for (auto [B, T] : {std::pair<int64_t, int64_t>{2, 64}, {4, 256}}) {
    const ModelSpec s = model_preset("gpt2-tiny");
    const int64_t h = s.n_embd, a = s.n_head, L = s.n_layer;
    for (const KeptCase& c : cases) {
      Policy pol = small_policy(B, T);
      pol.recompute = parse_recompute(c.recompute);
      pol.attention = c.attention;
      const Program p = build_training_program(s, pol, {}, cpu_capabilities());
      const MemoryPlan plan = plan_memory(p);
      const int classifier = test::last_op_of_kind(p, OpKind::classifier);
      ASSERT_GE(classifier, 0);
      for (int64_t layer = 0; layer < L; ++layer) {
        const A k = c.per_layer(layer, L);
        const uint64_t expected = uint64_t(4 * (k[0] * T * B * h + k[1] * a * T * T * B + k[2] * a * T * B + k[3] * T * B));
        const uint64_t kept = test::activation_bytes_live_at(p, plan, layer, classifier);
        EXPECT_EQ(kept, expected) << c.recompute << " " << attention_name(c.attention) << " layer " << layer << " B "
                                  << B << " T " << T;
      }
    }
  }
}

TEST(Gpt2Program, FlashAttentionKeepsNoSquareTensor) {
  Policy pol = small_policy(2, 256);
  pol.attention = AttentionKind::flash;
  const Program p = build_training_program(model_preset("gpt2-tiny"), pol, {}, cpu_capabilities());
  int flash_ops = 0;
  for (const Op& op : p.ops()) {
    EXPECT_NE(op.kind, OpKind::attention_forward);
    EXPECT_NE(op.kind, OpKind::attention_backward);
    flash_ops += op.kind == OpKind::flash_attention_forward || op.kind == OpKind::flash_attention_backward;
  }
  EXPECT_EQ(flash_ops, 3 * 4);  // training forward and backward, eval forward, 4 layers
  for (const TensorDesc& t : p.tensors()) {  // no (..., T, T) tensor: only y and lse (B, NH, T) are saved
    const auto& d = t.shape.dims();
    EXPECT_FALSE(d.size() >= 2 && d[d.size() - 1] == 256 && d[d.size() - 2] == 256) << t.name;
  }
}

TEST(Gpt2Program, EveryParameterGetsOneGradientWrittenFirstThenAccumulated) {
  const Program p = build_training_program(model_preset("gpt2-tiny"), small_policy(2, 16), {}, cpu_capabilities());
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
  const Program p = build_training_program(model_preset("gpt2-tiny"), pol, {}, cpu_capabilities());
  ASSERT_NE(p.find_section(SectionKind::micro), nullptr);
  EXPECT_EQ(p.find_section(SectionKind::micro)->repeat, 4);
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
      build_training_program(s, p, {}, cpu_capabilities());
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
