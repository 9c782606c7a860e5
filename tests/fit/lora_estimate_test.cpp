// LoRA and quantised-base estimates (fit/lora_estimate.hpp) against references computed here:
// adapter elements sum r (in + out) over the targets, written out from the model's shapes;
// quantised bytes are quant_storage() of each base weight; the frozen rest is the compute
// dtype. And against a real program: the test-only low-rank rewrite (support/low_rank_branch)
// builds the LoRA program itself, whose planned model states and largest live total the
// estimate must equal, and whose peak (packing included) it must come close to.
#include <gtest/gtest.h>

#include "core/error.hpp"
#include "fit/fit_search.hpp"
#include "fit/lora_estimate.hpp"
#include "graph/precision.hpp"
#include "graph/training_program.hpp"
#include "kernels/quant/quant_format.hpp"
#include "support/low_rank_branch.hpp"

namespace memfit {
namespace {

// kernels/quant's sizes, as the CLI hands them to fit/.
EstimateOptions with_quant() {
  EstimateOptions o;
  o.quant_storage = [](const BaseQuantPolicy& q, int64_t numel) {
    QuantSpec spec{q.kind == BaseQuant::nf4 ? QuantKind::nf4 : q.kind == BaseQuant::fp4 ? QuantKind::fp4 : QuantKind::int8,
                   q.block, q.double_quant};
    check_quant_spec(spec);
    const QuantStorage s = quant_storage(spec, numel);
    return QuantParts{s.codes, s.absmax, s.absmax2, s.offset};
  };
  return o;
}

Cluster one(const std::string& hw) {
  Cluster c;
  c.hw = hardware_preset(hw);
  return c;
}

std::string error_of(const ModelSpec& spec, const Policy& p) {
  try {
    estimate_run(spec, p, one("a100-80gb"), with_quant());
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

uint64_t category_total(const StateElements& st, Category c) {
  uint64_t b = 0;
  for (const auto& [key, n] : st)
    if (key.first == c) b += dtype_bytes(key.second, n);
  return b;
}

TEST(LoraEstimate, ModelStatesEqualTheClosedFormOfAdaptersAndQuantisedWeights) {
  const ModelSpec s = model_preset("llama-tiny");
  const int64_t C = s.n_embd, F = s.n_inner, HS = s.n_embd / s.n_head, r = 8;
  Policy p;
  p.batch = 2;
  p.seq = 32;
  p.precision = Precision::bf16;
  p.lora.rank = r;
  p.lora.targets = {"all-linear"};
  p.quantize_base.kind = BaseQuant::nf4;
  p.quantize_base.double_quant = true;
  const ProgramSummary sum = plan_summary(s, p, one("a100-80gb").hw, with_quant());
  // Per block: q, k, v, o, gate, up, down as HF holds them.
  const int64_t per_block = r * ((C + s.n_head * HS) + 2 * (C + s.n_kv_head * HS) + (s.n_head * HS + C) +
                                 2 * (C + F) + (F + C));
  const int64_t adapters = per_block * s.n_layer;
  EXPECT_EQ(sum.lora.adapter_elements, adapters);
  EXPECT_EQ(sum.lora.adapters, 7 * s.n_layer);
  const QuantSpec q{QuantKind::nf4, 64, true};
  const int64_t qkv_rows = (s.n_head + 2 * s.n_kv_head) * HS;
  const uint64_t quantised = uint64_t(s.n_layer) * (quant_storage(q, qkv_rows * C).total() +
                                                    quant_storage(q, C * s.n_head * HS).total() +
                                                    2 * quant_storage(q, F * C).total() + quant_storage(q, C * F).total());
  EXPECT_EQ(sum.lora.quantized_bytes, quantised);
  // Embedding, lm_head (untied) and norms stay bf16, as a frozen parameter is stored under bf16.
  const uint64_t frozen = 2 * (2 * s.padded_vocab * C + (2 * s.n_layer + 1) * C);
  EXPECT_EQ(sum.lora.frozen_bytes, frozen);
  // Adapters: bf16 values, fp32 gradients (the default), fp32 masters, two fp32 AdamW moments.
  EXPECT_EQ(category_total(sum.states, Category::parameters), quantised + frozen + 2 * uint64_t(adapters));
  EXPECT_EQ(category_total(sum.states, Category::gradients), 4 * uint64_t(adapters));
  EXPECT_EQ(category_total(sum.states, Category::master_weights), 4 * uint64_t(adapters));
  EXPECT_EQ(category_total(sum.states, Category::optimizer_state), 8 * uint64_t(adapters));
  // No base weight keeps a gradient: the live gradients never exceed the adapters'.
  EXPECT_LE(sum.category_peak[size_t(Category::gradients)], 4 * uint64_t(adapters));
}

TEST(LoraEstimate, PeftDefaultTargetsAndNamesAsPeftMatchesThem) {
  LoraPolicy l;
  l.rank = 4;
  const ModelSpec llama = model_preset("llama-tiny"), gpt2 = model_preset("gpt2-tiny");
  std::vector<LoraLinear> t = lora_targets(llama, l);
  ASSERT_EQ(t.size(), size_t(2 * llama.n_layer));
  EXPECT_EQ(t[0].module, "model.layers.0.self_attn.q_proj");
  EXPECT_EQ(t[1].module, "model.layers.0.self_attn.v_proj");
  EXPECT_EQ(t[1].out, llama.n_kv_head * llama.head_dim());
  t = lora_targets(gpt2, l);
  ASSERT_EQ(t.size(), size_t(gpt2.n_layer));
  EXPECT_EQ(t[0].module, "transformer.h.0.attn.c_attn");
  // "c_proj" is both GPT-2's attention and MLP output; a longer suffix picks one.
  l.targets = {"c_proj"};
  EXPECT_EQ(lora_targets(gpt2, l).size(), size_t(2 * gpt2.n_layer));
  l.targets = {"mlp.c_proj"};
  EXPECT_EQ(lora_targets(gpt2, l).size(), size_t(gpt2.n_layer));
  l.targets = {};
  l.target_regex = R"(.*\.1\.mlp\.c_fc)";
  t = lora_targets(gpt2, l);
  ASSERT_EQ(t.size(), 1u);
  EXPECT_EQ(t[0].param, "h.1.mlp.c_fc.weight");
}

TEST(LoraEstimate, BadInputIsRefusedInOneLineNamingWhatIsWrong) {
  const ModelSpec s = model_preset("llama-tiny");
  Policy p;
  p.batch = 1;
  p.seq = 16;
  p.lora.rank = 4;
  p.lora.targets = {"q_proj", "x_proj"};
  std::string e = error_of(s, p);
  EXPECT_NE(e.find("'x_proj' matches no linear layer"), std::string::npos) << e;
  EXPECT_NE(e.find("q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj"), std::string::npos) << e;
  p.lora.targets = {"k_proj"};
  p.lora.rank = s.n_kv_head * s.head_dim() + 1;  // k_proj's out features are the smallest
  e = error_of(s, p);
  EXPECT_NE(e.find("larger than min(in, out) = " + std::to_string(s.n_kv_head * s.head_dim())), std::string::npos) << e;
  EXPECT_NE(e.find("k_proj"), std::string::npos) << e;
  p.lora.rank = 0;
  p.quantize_base.kind = BaseQuant::nf4;
  e = error_of(s, p);
  EXPECT_NE(e.find("add LoRA (--lora-rank) or --freeze"), std::string::npos) << e;
  p.lora.rank = 4;
  p.quantize_base.block = 48;
  e = error_of(s, p);
  EXPECT_NE(e.find("48"), std::string::npos) << e;
  EXPECT_EQ(e.find("quant_storage is unset"), std::string::npos) << e;
  p.quantize_base.block = 64;
  p.lora.target_regex = "nothing.*";
  e = error_of(s, p);
  EXPECT_NE(e.find("matches no linear layer"), std::string::npos) << e;
  for (const std::string& m : {e})
    EXPECT_EQ(m.find('\n'), std::string::npos) << m;
}

// The estimate against the LoRA program itself (the test rewrite: fp32, no dropout).
TEST(LoraEstimate, MatchesTheStatesAndLiveBytesOfARealLowRankProgram) {
  const ModelSpec s = model_preset("gpt2-tiny");
  for (const char* rec : {"none", "full"}) {
    Policy p;
    p.batch = 4;
    p.seq = 64;
    p.recompute = parse_recompute(rec);
    p.with_eval = false;
    Policy lora = p;
    lora.lora.rank = 4;
    lora.lora.targets = {"c_attn", "mlp.c_fc"};
    const Hardware hw = hardware_preset("a100-80gb");
    const ProgramSummary est = plan_summary(s, lora, hw, {});
    ForwardRewrites branch = {std::make_shared<test::LowRankBranch>(
        std::vector<std::string>{"h.*.attn.c_attn.weight", "h.*.mlp.c_fc.weight"}, 4, 2.0f)};
    Policy base = p;  // every other parameter frozen, as LoRA freezes them
    base.freeze = {"wte.weight", "wpe.weight", "ln_f.*", "h.*.ln_*", "h.*.attn.c_proj.*", "h.*.mlp.c_proj.*"};
    const Program real = build_training_program(s, base, Topology{}, hw.capabilities, branch);
    const MemoryPlan plan = plan_memory(real, kDefaultTierAlignments);
    const StateElements states = model_state_elements(real);
    for (Category c : {Category::parameters, Category::gradients, Category::master_weights, Category::optimizer_state})
      EXPECT_EQ(category_total(est.states, c), category_total(states, c)) << category_name(c) << " " << rec;
    // Live bytes at the peak op are the real program's exactly (the saved x A^T included);
    // only the packing differs: the proxy's fragmentation stands in for the real one's.
    EXPECT_EQ(est.plan_peak - est.packing_overhead, plan.tier(Tier::device).max_live_bytes) << rec;
    const double real_peak = double(plan.tier(Tier::device).peak_bytes);
    EXPECT_NEAR(double(est.plan_peak), real_peak, 0.05 * real_peak) << rec;
  }
}

TEST(LoraEstimate, QloraOnLlama65bFitsOneA6000) {
  const ModelSpec s = model_preset("llama-65b");
  EXPECT_EQ(s.parameter_count(), 65'285'660'672);  // LLaMA-65B, padded vocabulary 32000
  Policy p;
  p.batch = 1;
  p.seq = 512;
  p.precision = Precision::bf16;
  p.recompute = parse_recompute("full");
  p.lora.rank = 64;
  p.lora.targets = {"all-linear"};
  p.quantize_base.kind = BaseQuant::nf4;
  p.quantize_base.double_quant = true;
  const Cluster c = one("a6000-48gb");
  const RankEstimate e = estimate_run(s, p, c, with_quant());
  EXPECT_TRUE(check_fit(e, c, c.hw.memory_bytes).fits()) << format_estimate(e, c, with_quant());
  EXPECT_FALSE(e.from_program);
  EXPECT_TRUE(e.lora.on);
  // The same run training every weight needs over ten times the card.
  Policy full = p;
  full.lora = {};
  full.quantize_base = {};
  EXPECT_GT(estimate_run(s, full, c, {}).device_bytes, 10 * c.hw.memory_bytes);
}

// --fit proposes LoRA only when nothing training every weight fits without offload, after
// every such family, labelled; and never when a plain family fits.
TEST(LoraEstimate, FitProposesLoraLastAndOnlyWhenNothingElseFitsOnTheDevice) {
  Policy p;
  p.seq = 512;
  FitOptions fo;
  fo.keep = 3;
  const Cluster c = one("a6000-48gb");
  const FitResult r = fit_search(model_preset("llama-65b"), p, c, with_quant(), fo);
  ASSERT_FALSE(r.ranked.empty());
  EXPECT_FALSE(r.ranked.front().changes_training);
  EXPECT_NE(r.ranked.front().policy.offload_params, Tier::device);  // the base fits only offloaded
  bool seen = false;
  for (const FitCandidate& f : r.ranked) {
    if (seen) EXPECT_TRUE(f.changes_training) << f.family;  // nothing unlabelled after a LoRA one
    seen = seen || f.changes_training;
    EXPECT_EQ(f.changes_training, f.policy.lora.enabled()) << f.family;
  }
  EXPECT_TRUE(seen);
  EXPECT_NE(format_fit(r, c, c.hw.memory_bytes).find("changes what trains"), std::string::npos);
  p.seq = 128;
  const FitResult small = fit_search(model_preset("gpt2-tiny"), p, c, {}, fo);
  ASSERT_FALSE(small.ranked.empty());
  for (const FitCandidate& f : small.ranked) EXPECT_FALSE(f.changes_training) << f.family;
}

}  // namespace
}  // namespace memfit
