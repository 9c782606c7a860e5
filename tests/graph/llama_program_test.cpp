// The LLaMA builder: parameter counts of the presets against the published totals (the
// shape arithmetic of ModelSpec and the tensors the builder declares agree with them), the
// program's structure (grouped-query qkv width, rotary in place, SwiGLU keeps gate and up,
// an untied lm_head with its own gradient), every recompute mode and attention kind planning
// without overlap, `memfit train` training it, and refusing scaled rotary embeddings in one line.
#include <gtest/gtest.h>

#include <fstream>
#include <map>

#include <nlohmann/json.hpp>

#include "graph/recompute.hpp"
#include "io/hf_config.hpp"
#include "graph/training_program.hpp"
#include "plan/memory_plan.hpp"
#include "support/paths.hpp"
#include "support/plan_queries.hpp"
#include "support/run_cli.hpp"
#include "kernels/backend.hpp"

namespace memfit {
namespace {

TEST(LlamaProgram, ParameterCountsMatchThePublishedTotals) {
  const struct {
    const char* name;
    int64_t params;
  } cases[] = {{"llama-2-7b", 6'738'415'616},  {"llama-2-13b", 13'015'864'320}, {"llama-2-70b", 68'976'648'192},
               {"llama-3-8b", 8'030'261'248},  {"llama-3-70b", 70'553'706'496}, {"mistral-7b", 7'241'732'096},
               // The hub's safetensors totals; 3.2 ties its embeddings.
               {"llama-3.1-8b", 8'030'261'248}, {"llama-3.2-1b", 1'235'814'400}, {"llama-3.2-3b", 3'212'749'824}};
  for (const auto& c : cases) {
    const ModelSpec spec = model_preset(c.name);
    EXPECT_EQ(spec.parameter_count(), c.params) << c.name;
    Policy pol;
    pol.batch = 1;
    pol.seq = 16;
    pol.with_eval = false;
    const Program p = build_training_program(spec, pol, {}, cpu_capabilities());
    EXPECT_EQ(p.parameter_count(), c.params) << c.name;
  }
}

// Against HF transformers (tools/make_llama_param_fixtures.py: the models built on the meta
// device): every parameter tensor of small Llama, Mistral and Qwen2 models, by name and shape,
// with HF's q, k and v projections (and Qwen2's biases) concatenated into memfit's qkv_proj.
TEST(LlamaProgram, ParametersMatchHfTransformersForEachFamily) {
  for (const char* family : {"llama", "mistral", "qwen2"}) {
    std::ifstream f(test::fixture_path(std::string("llama_family_params/") + family + ".json"));
    ASSERT_TRUE(f.good()) << family;
    const nlohmann::json fx = nlohmann::json::parse(f);
    const std::string config = test::temp_dir() + "/" + family + ".json";
    test::write_file(config, fx["config"].dump());
    const ModelSpec spec = read_hf_config(config);
    std::map<std::string, std::vector<int64_t>> expected;
    for (const auto& [hf_name, shape] : fx["parameters"].items()) {
      std::string name = hf_name.starts_with("model.") ? hf_name.substr(6) : hf_name;
      std::vector<int64_t> dims = shape.get<std::vector<int64_t>>();
      for (const char* proj : {"q_proj", "k_proj", "v_proj"}) {
        const auto at = name.find(proj);
        if (at == std::string::npos) continue;
        name.replace(at, 6, "qkv_proj");
        auto [it, fresh] = expected.try_emplace(name, dims);
        if (!fresh) it->second[0] += dims[0];  // rows of q, then k, then v
        dims.clear();
        break;  // "qkv_proj" itself contains "v_proj"
      }
      if (!dims.empty()) expected[name] = dims;
    }
    Policy pol;
    pol.batch = 1;
    pol.seq = 8;
    pol.with_eval = false;
    const Program p = build_training_program(spec, pol, {}, cpu_capabilities());
    std::map<std::string, std::vector<int64_t>> built;
    for (const ParamEntry& e : p.params()) built[e.name] = p.tensor(e.value).shape.dims();
    EXPECT_EQ(built, expected) << family;
    EXPECT_EQ(p.parameter_count(), fx["total"].get<int64_t>()) << family;
    EXPECT_EQ(spec.parameter_count(), fx["total"].get<int64_t>()) << family;
  }
}

TEST(LlamaProgram, GroupedQueryAttentionRopeAndSwiGluHaveTheirShapes) {
  const ModelSpec s = model_preset("llama-tiny");  // 4 heads, 2 key/value heads, head size 16
  Policy pol;
  pol.batch = 2;
  pol.seq = 8;
  const Program p = build_training_program(s, pol, {}, cpu_capabilities());
  const TensorDesc& qkv_w = p.tensor(p.find_tensor("layers.0.self_attn.qkv_proj.weight"));
  EXPECT_EQ(qkv_w.shape, (Shape{(4 + 2 * 2) * 16, 64}));
  const TensorId lm_head = p.find_tensor("lm_head.weight");
  ASSERT_NE(lm_head, kNoTensor);
  bool saw_rope = false, saw_swiglu_bwd = false;
  for (const Op& op : p.ops()) {
    if (op.kind == OpKind::rope_forward) {
      saw_rope = true;
      EXPECT_EQ(op.inplace, (std::vector<std::pair<int, int>>{{0, 0}}));
      EXPECT_EQ(p.tensor(op.outputs[0]).shape, (Shape{2, 8, 128}));
    }
    if (op.kind == OpKind::swiglu_backward) {
      saw_swiglu_bwd = true;
      EXPECT_EQ(op.inputs.size(), 3u);  // dy, gate, up: both kept for backward
    }
    if (op.kind == OpKind::embedding_forward) { EXPECT_EQ(op.inputs.size(), 2u); }  // no position table
  }
  EXPECT_TRUE(saw_rope);
  EXPECT_TRUE(saw_swiglu_bwd);
  for (const ParamEntry& e : p.params()) EXPECT_NE(e.grad, kNoTensor) << e.name << " gets no gradient";
}

TEST(LlamaProgram, EveryRecomputeModeAndAttentionPlansWithoutOverlap) {
  const ModelSpec s = model_preset("llama-tiny");
  uint64_t none_peak = 0;
  for (AttentionKind attn : {AttentionKind::plain, AttentionKind::flash})
    for (const char* rec : {"none", "selective", "selective:mlp_activation,norms", "full", "every:2"})
      for (Precision prec : {Precision::fp32, Precision::bf16}) {
        Policy pol;
        pol.batch = 2;
        pol.seq = 32;
        pol.attention = attn;
        pol.precision = prec;
        pol.recompute = parse_recompute(rec);
        const Program p = build_training_program(s, pol, {}, cpu_capabilities());
        const MemoryPlan plan = plan_memory(p);
        EXPECT_EQ(find_overlap(p, plan), "") << rec;
        if (attn == AttentionKind::plain && prec == Precision::fp32 && std::string(rec) == "none")
          none_peak = plan.tier(Tier::device).peak_bytes;
        if (attn == AttentionKind::plain && prec == Precision::fp32 && std::string(rec) == "full") {
          EXPECT_LT(plan.tier(Tier::device).peak_bytes, none_peak);
          EXPECT_GT(recompute_flops(p), 0);
        }
        // llama kinds have 16-bit forms on the hardware planned for: no fp32 islands around them.
        if (prec == Precision::bf16)
          for (const Op& op : p.ops())
            if (op.kind == OpKind::rmsnorm_forward || op.kind == OpKind::swiglu_forward || op.kind == OpKind::rope_forward) {
              EXPECT_EQ(p.tensor(op.outputs[0]).dtype, DType::bf16) << op.name;
            }
      }
}

// What one LLaMA block keeps for backward, in fp32 elements, counted like the GPT-2 test
// against Korthikanti et al. (bytes of each layer's activations live at the classifier, by
// the layer that produced them): the two norm outputs (inputs of the qkv and gate/up
// products), the rotated qkv ((NH + 2 KV) HS wide: grouped-query k and v are narrower), the
// attention output, the residual after attention and the block's output (norm inputs), gate,
// up and the SwiGLU output (F wide), the two norms' rstd (sb), and probabilities (a s^2 b) or
// the flash log-sum-exp (a s b). The un-rotated qkv, o_proj's and down_proj's outputs die early.
TEST(LlamaProgram, ActivationsPerLayerMatchTheTensorList) {
  const ModelSpec s = model_preset("llama-tiny");
  const int64_t B = 2, T = 32, h = s.n_embd, F = s.n_inner, a = s.n_head;
  const int64_t Q = (s.n_head + 2 * s.n_kv_head) * s.head_dim();
  const struct {
    const char* recompute;
    AttentionKind attention;
    int64_t elements;
  } cases[] = {
      {"none", AttentionKind::plain, B * T * (5 * h + Q + 3 * F + 2) + a * T * T * B},
      {"selective", AttentionKind::plain, B * T * (5 * h + Q + 3 * F + 2)},
      {"selective:mlp_activation,norms", AttentionKind::plain, B * T * (3 * h + Q + 2 * F + 2) + a * T * T * B},
      {"none", AttentionKind::flash, B * T * (5 * h + Q + 3 * F + 2) + a * T * B},
      {"full", AttentionKind::flash, B * T * h},
  };
  for (const auto& c : cases) {
    Policy pol;
    pol.batch = B;
    pol.seq = T;
    pol.with_eval = false;
    pol.recompute = parse_recompute(c.recompute);
    pol.attention = c.attention;
    const Program p = build_training_program(s, pol, {}, cpu_capabilities());
    const MemoryPlan plan = plan_memory(p);
    const int classifier = test::last_op_of_kind(p, OpKind::classifier);
    ASSERT_GE(classifier, 0);
    for (int64_t layer = 0; layer < s.n_layer; ++layer) {
      const uint64_t kept = test::activation_bytes_live_at(p, plan, layer, classifier);
      EXPECT_EQ(kept, uint64_t(4 * c.elements)) << c.recompute << " " << attention_name(c.attention) << " layer " << layer;
    }
  }
}

// llama-tiny trains from scratch (grouped-query attention, RMSNorm, rope, SwiGLU) with the loss
// falling and the arena exactly as planned; a model with scaled rotary frequencies (Llama 3.1's
// rope_scaling), which the rope kernel does not compute, is refused in one line but planned.
TEST(LlamaProgram, TrainsAndRefusesScaledRopeWithOneLine) {
  const std::string report = test::temp_dir() + "/llama.json";
  auto r = test::run_memfit("train --model llama-tiny --steps 30 --batch 4 --seq 64 --lr 3e-3 --val-fraction 0 "
                            "--report-json " + report);
  ASSERT_EQ(r.status, 0) << r.err;
  std::ifstream f(report);
  const auto j = nlohmann::json::parse(f);
  EXPECT_LT(j["loss"]["last"].get<double>(), j["loss"]["first"].get<double>() - 0.5) << j["loss"].dump();
  EXPECT_EQ(j["memory"]["measured_peak_bytes"]["device"], j["memory"]["planned_peak_bytes"]["device"]);

  const std::string config = test::temp_dir() + "/llama31.json";
  std::ofstream(config) << R"({"model_type":"llama","num_hidden_layers":2,"num_attention_heads":4,)"
                           R"("num_key_value_heads":2,"hidden_size":64,"intermediate_size":172,"vocab_size":256,)"
                           R"("max_position_embeddings":256,"rope_theta":500000.0,)"
                           R"("rope_scaling":{"rope_type":"yarn","factor":8.0}})";
  r = test::run_memfit("train --model " + config + " --steps 1 --batch 1 --seq 16");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("memfit: error: [train]"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("'yarn'"), std::string::npos) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  const auto plan = test::run_memfit("plan --model " + config + " --batch 1 --seq 16");
  EXPECT_EQ(plan.status, 0) << plan.err;
}

}  // namespace
}  // namespace memfit
