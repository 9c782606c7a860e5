// --quantize-base on the program (graph/quantize_base.hpp): every frozen linear weight of the
// blocks is stored as codes + scales (+ scales2, offset) whose bytes are those of bnb's format
// per HF tensor, counted here from the model's shapes; every product with it is a
// quant_linear; the backward has no weight-gradient product for it.
#include <gtest/gtest.h>

#include <map>

#include "core/error.hpp"
#include "graph/training_program.hpp"
#include "kernels/backend.hpp"
#include "kernels/quant/quant_format.hpp"

namespace memfit {
namespace {

Program build(const char* model, const std::vector<std::string>& freeze, BaseQuant kind, bool dq,
              Precision precision = Precision::fp32) {
  Policy pol;
  pol.batch = 2;
  pol.seq = 16;
  pol.freeze = freeze;
  pol.precision = precision;
  pol.quantize_base.kind = kind;
  pol.quantize_base.double_quant = dq;
  return build_training_program(model_preset(model), pol, {}, cpu_capabilities());
}

// The HF tensors of a memfit weight, as rows: llama's fused q/k/v is three.
std::vector<int64_t> hf_rows(const ModelSpec& s, const std::string& name, int64_t rows) {
  if (!name.ends_with("qkv_proj.weight")) return {rows};
  const int64_t hd = s.n_embd / s.n_head;
  return {s.n_head * hd, s.n_kv_head * hd, s.n_kv_head * hd};
}

void check_program(const char* model, const std::vector<std::string>& freeze, BaseQuant kind, bool dq,
                   int expect_quantised) {
  SCOPED_TRACE(std::string(model) + " " + std::string(base_quant_name(kind)) + (dq ? " double-quant" : ""));
  const ModelSpec spec = model_preset(model);
  const Program p = build(model, freeze, kind, dq);
  const QuantSpec qs{kind == BaseQuant::nf4 ? QuantKind::nf4 : kind == BaseQuant::fp4 ? QuantKind::fp4 : QuantKind::int8,
                     64, dq};
  std::map<TensorId, std::string> codes;
  int quantised = 0;
  for (const ParamEntry& e : p.params()) {
    if (e.value != kNoTensor) {
      EXPECT_TRUE(e.plain_storage()) << e.name;
      continue;
    }
    ++quantised;
    EXPECT_TRUE(e.frozen()) << e.name;
    const TensorId c = e.stored(ParamRole::codes);
    ASSERT_NE(c, kNoTensor) << e.name;
    codes[c] = e.name;
    const Shape s = p.tensor(c).shape;
    ASSERT_EQ(s.rank(), 2);
    uint64_t want = 0, got = 0;
    for (int64_t rows : hf_rows(spec, e.name, s[0])) want += quant_storage(qs, rows * s[1]).total();
    for (const StoredTensor& st : e.storage) got += p.tensor(st.id).bytes();
    EXPECT_EQ(got, want) << e.name;
    EXPECT_EQ(e.storage.size(), dq ? 4u : 2u);
    EXPECT_EQ(e.grad, kNoTensor);
    EXPECT_EQ(e.master, kNoTensor);
    EXPECT_TRUE(e.state.empty());
    EXPECT_FALSE(e.name.find("wte") != std::string::npos || e.name.find("embed") != std::string::npos ||
                 e.name.find("lm_head") != std::string::npos);
  }
  EXPECT_EQ(quantised, expect_quantised);
  int forward = 0, backward = 0;
  for (const Op& op : p.ops())
    for (size_t i = 0; i < op.inputs.size(); ++i) {
      if (!codes.count(op.inputs[i])) continue;
      EXPECT_EQ(i, 1u) << op.name;
      EXPECT_TRUE(op.kind == OpKind::quant_linear || op.kind == OpKind::quant_linear_backward)
          << op.name << " reads " << codes[op.inputs[i]] << " as " << op_kind_name(op.kind);
      EXPECT_EQ(op.name.find(".bwd_weight"), std::string::npos) << op.name;
      if (op.kind == OpKind::quant_linear && op.phase == Phase::forward) ++forward;
      if (op.kind == OpKind::quant_linear_backward) ++backward;
    }
  // The micro-step's forward and validation's each read every quantised weight once; the
  // backward needs dx of every one but the first block's first product in a frozen prefix.
  EXPECT_EQ(forward, 2 * expect_quantised);
  EXPECT_GT(backward, 0);
  EXPECT_LE(backward, expect_quantised);
}

TEST(QuantizeBase, StorageBytesAreBnbsPerHfTensorAndProductsAreReplaced) {
  const int64_t L = model_preset("gpt2-tiny").n_layer, LL = model_preset("llama-tiny").n_layer;
  for (BaseQuant k : {BaseQuant::nf4, BaseQuant::fp4, BaseQuant::int8})
    for (bool dq : {false, true}) {
      if (dq && k == BaseQuant::int8) continue;
      check_program("gpt2-tiny", {"h.*.mlp.*", "h.*.attn.*"}, k, dq, int(4 * L));
      check_program("llama-tiny", {"layers.*.self_attn.*", "layers.*.mlp.*"}, k, dq, int(5 * LL));
    }
}

TEST(QuantizeBase, OnlyFrozenWeightsAreQuantisedAndScalesStayFp32) {
  const Program part = build("gpt2-tiny", {"h.0.mlp.*"}, BaseQuant::nf4, false);
  int quantised = 0;
  for (const ParamEntry& e : part.params()) quantised += e.value == kNoTensor;
  EXPECT_EQ(quantised, 2);  // h.0.mlp.c_fc and c_proj; their biases stay plain
  // bf16: the scales stay fp32, the tile takes the compute dtype.
  const Program bf = build("llama-tiny", {"layers.*.mlp.*"}, BaseQuant::nf4, true, Precision::bf16);
  for (const Op& op : bf.ops()) {
    if (op.kind != OpKind::quant_linear) continue;
    EXPECT_EQ(bf.tensor(op.inputs[2]).dtype, DType::u8);
    EXPECT_EQ(bf.tensor(op.inputs[3]).dtype, DType::f32);
    EXPECT_EQ(bf.tensor(op.inputs[4]).dtype, DType::f32);
    EXPECT_EQ(bf.tensor(op.workspace[0]).dtype, DType::bf16);
  }
}

TEST(QuantizeBase, RefusesWithoutFrozenWeightsAndBadBlocks) {
  Policy pol;
  pol.quantize_base.kind = BaseQuant::nf4;
  EXPECT_THROW(build_training_program(model_preset("gpt2-tiny"), pol, {}, cpu_capabilities()), Error);
  pol.freeze = {"h.*"};
  pol.quantize_base.block = 48;
  EXPECT_THROW(build_training_program(model_preset("gpt2-tiny"), pol, {}, cpu_capabilities()), Error);
}

}  // namespace
}  // namespace memfit
