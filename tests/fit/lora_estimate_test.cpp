// LoRA and quantised-base estimates (the real program planned, its parts named by
// fit/lora_breakdown.hpp) against references computed here from the model's shapes: adapter
// elements sum r (in + out) over the targets; quantised bytes are quant_storage() of each HF
// base weight (q, k and v apart, as bitsandbytes quantises them); the frozen rest is the
// compute dtype; the branch saves x A^T [tokens, r] per adapter.
#include <gtest/gtest.h>

#include "core/error.hpp"
#include "fit/fit_search.hpp"
#include "graph/lora.hpp"
#include "graph/precision.hpp"
#include "graph/training_program.hpp"
#include "kernels/quant/quant_format.hpp"

namespace memfit {
namespace {

// Estimates plan the real program; the options of a GPU preset.
EstimateOptions with_quant() { return EstimateOptions{}; }

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
  (void)qkv_rows;
  const uint64_t quantised = uint64_t(s.n_layer) * (quant_storage(q, s.n_head * HS * C).total() +
                                                    2 * quant_storage(q, s.n_kv_head * HS * C).total() +
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
  auto targets = [](const std::string& model, LoraPolicy l) {
    Policy p;
    p.batch = 1;
    p.seq = 16;
    const Program prog = build_training_program(model_preset(model), p, Topology{}, hardware_preset("a100-80gb").capabilities);
    return lora_targets(prog, l);
  };
  LoraPolicy l;
  l.rank = 4;
  std::vector<LinearModule> t = targets("llama-tiny", l);
  ASSERT_EQ(t.size(), size_t(2 * model_preset("llama-tiny").n_layer));
  EXPECT_EQ(t[0].name, "layers.0.self_attn.q_proj");
  EXPECT_EQ(t[1].name, "layers.0.self_attn.v_proj");
  EXPECT_EQ(t[1].rows, model_preset("llama-tiny").n_kv_head * model_preset("llama-tiny").head_dim());
  t = targets("gpt2-tiny", l);
  EXPECT_EQ(t[0].name, "h.0.attn.c_attn");
  l.targets = {"c_proj"};  // attn.c_proj and mlp.c_proj
  EXPECT_EQ(targets("gpt2-tiny", l).size(), size_t(2 * model_preset("gpt2-tiny").n_layer));
  l.targets = {"mlp.c_proj"};
  EXPECT_EQ(targets("gpt2-tiny", l).size(), size_t(model_preset("gpt2-tiny").n_layer));
  l.targets.clear();
  l.target_regex = "transformer\\.h\\.1\\.mlp\\..*";
  t = targets("gpt2-tiny", l);
  ASSERT_EQ(t.size(), 2u);
  EXPECT_EQ(t[0].weight, "h.1.mlp.c_fc.weight");
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
  EXPECT_NE(e.find("down_proj, gate_proj, k_proj, o_proj, q_proj, up_proj, v_proj"), std::string::npos) << e;
  p.lora.targets = {"k_proj"};
  p.lora.rank = s.n_kv_head * s.head_dim() + 1;  // k_proj's out features are the smallest
  e = error_of(s, p);
  EXPECT_NE(e.find(fmt::format("larger than min(in, out) = min({}, {})", s.n_embd, s.n_kv_head * s.head_dim())),
            std::string::npos) << e;
  EXPECT_NE(e.find("k_proj"), std::string::npos) << e;
  p.lora.rank = 0;
  p.quantize_base.kind = BaseQuant::nf4;
  e = error_of(s, p);
  EXPECT_NE(e.find("add LoRA (--lora-rank) or --freeze"), std::string::npos) << e;
  p.lora.rank = 4;
  p.quantize_base.block = 48;
  e = error_of(s, p);
  EXPECT_NE(e.find("48"), std::string::npos) << e;
  p.quantize_base.block = 64;
  p.lora.target_regex = "nothing.*";
  e = error_of(s, p);
  EXPECT_NE(e.find("matches no linear layer"), std::string::npos) << e;
  for (const std::string& m : {e})
    EXPECT_EQ(m.find('\n'), std::string::npos) << m;
}

// The branch's saved tensors: x A^T [tokens, r] per adapter in the compute dtype (and
// dropout(x) [tokens, in] per adapter with dropout); fp32 here.
TEST(LoraEstimate, BranchTensorsAreThoseOfTheClosedForm) {
  const ModelSpec s = model_preset("gpt2-tiny");
  for (double dropout : {0.0, 0.1}) {
    Policy p;
    p.batch = 4;
    p.seq = 64;
    p.with_eval = false;
    p.lora.rank = 4;
    p.lora.dropout = dropout;
    p.lora.targets = {"c_attn", "mlp.c_fc"};
    const ProgramSummary est = plan_summary(s, p, hardware_preset("a100-80gb"), {});
    const uint64_t tokens = uint64_t(p.batch * p.seq), adapters = 2 * uint64_t(s.n_layer);
    EXPECT_EQ(est.lora.adapters, int(adapters));
    EXPECT_EQ(est.lora.branch_bytes, adapters * tokens * 4 * (4 + (dropout > 0 ? uint64_t(s.n_embd) : 0)));
    EXPECT_EQ(est.lora.tile_bytes, 0u);
    EXPECT_EQ(est.lora.quantized_bytes, 0u);
  }
}

// DoRA adds a magnitude per output row of each target, keeps z [tokens, out] of each adapted
// product, and computes its norms at r x in x out multiply-adds (plus 3 in x out) per forward.
TEST(LoraEstimate, DoraPartsAreThoseOfTheClosedForm) {
  const ModelSpec s = model_preset("gpt2-tiny");
  Policy p;
  p.batch = 4;
  p.seq = 64;
  p.with_eval = false;
  p.lora.rank = 4;
  p.lora.targets = {"c_attn", "mlp.c_fc"};
  const ProgramSummary lora = plan_summary(s, p, hardware_preset("a100-80gb"), {});
  EXPECT_EQ(lora.lora.dora_magnitudes, 0);
  p.lora.dora = true;
  const ProgramSummary dora = plan_summary(s, p, hardware_preset("a100-80gb"), {});
  const int64_t C = s.n_embd, outs = 3 * C + 4 * C, L = s.n_layer, tokens = p.batch * p.seq;
  EXPECT_EQ(dora.lora.dora_magnitudes, L * outs);
  EXPECT_EQ(dora.lora.adapter_elements, lora.lora.adapter_elements + L * outs);
  EXPECT_EQ(dora.lora.dora_saved_bytes, uint64_t(L * tokens * outs * 4));  // fp32
  EXPECT_DOUBLE_EQ(dora.lora.dora_norm_flops, double(L * outs * C * (2 * 4 + 3)));
  EXPECT_GT(dora.plan_peak, lora.plan_peak);
  // With dropout (PEFT's second base product, of the dropped input) each product still keeps
  // one z, p + q; the dropped inputs are kept as in plain LoRA's branch.
  p.lora.dropout = 0.1;
  const ProgramSummary dropped = plan_summary(s, p, hardware_preset("a100-80gb"), {});
  EXPECT_EQ(dropped.lora.dora_saved_bytes, dora.lora.dora_saved_bytes);
  EXPECT_EQ(dropped.lora.branch_bytes, dora.lora.branch_bytes + uint64_t(L * tokens * (C + C) * 4));
  EXPECT_DOUBLE_EQ(dropped.lora.dora_norm_flops, dora.lora.dora_norm_flops);
  EXPECT_GT(dropped.plan_peak, dora.plan_peak);
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
  EXPECT_TRUE(e.lora.on);
  // The same run training every weight needs over ten times the card.
  Policy full = p;
  full.lora = {};
  full.quantize_base = {};
  EXPECT_GT(estimate_run(s, full, c, {}).device_bytes, 10 * c.hw.memory_bytes);
}

// QLoRA's most common card, a T4 (and a V100) has fp16 tensor cores and no bf16 products: the
// plan's 16 bits there are fp16, a bf16 run would multiply in fp32 islands (at 8.1 of 65
// TFLOP/s), and --fit searches fp16. Llama-2-7B QLoRA r = 64 on every linear fits its 15 GiB.
TEST(LoraEstimate, QloraOnAT4ComputesInFp16) {
  const Cluster t4 = one("t4-16gb"), a100 = one("a100-80gb");
  EXPECT_EQ(native_half_precision(t4.hw), Precision::fp16);
  EXPECT_EQ(native_half_precision(one("v100-32gb").hw), Precision::fp16);
  EXPECT_EQ(native_half_precision(a100.hw), Precision::bf16);
  const ModelSpec s = model_preset("llama-2-7b");
  Policy p;
  p.batch = 1;
  p.seq = 512;
  p.recompute = parse_recompute("full");
  p.attention = AttentionKind::flash;
  p.lora.rank = 64;
  p.lora.targets = {"all-linear"};
  p.quantize_base.kind = BaseQuant::nf4;
  p.quantize_base.double_quant = true;
  auto product_islands = [&](Precision prec) {
    Policy q = p;
    q.precision = prec;
    int n = 0;
    const Program program = build_training_program(s, q, {}, t4.hw.capabilities);
    for (const Op& op : program.ops())
      if (op.kind == OpKind::cast && op.name.find(".cast_in0") != std::string::npos &&
          (op.name.find("_proj.") != std::string::npos || op.name.find("core.") != std::string::npos))
        ++n;
    return n;
  };
  EXPECT_EQ(product_islands(Precision::fp16), 0);
  EXPECT_GT(product_islands(Precision::bf16), 32 * 7);  // at least every quantised product of every block
  Policy half = p, brain = p;
  half.precision = Precision::fp16;
  brain.precision = Precision::bf16;
  const RankEstimate e16 = estimate_run(s, half, t4, with_quant()), e_bf = estimate_run(s, brain, t4, with_quant());
  EXPECT_TRUE(check_fit(e16, t4, t4.hw.memory_bytes).fits()) << format_estimate(e16, t4, with_quant());
  EXPECT_GT(e_bf.step_seconds, 3 * e16.step_seconds);
  // --fit on each card searches its own 16 bits.
  Policy g;
  g.seq = 512;
  FitOptions fo;
  fo.keep = 3;
  const FitResult on_t4 = fit_search(model_preset("gpt2"), g, t4, {}, fo), on_a100 = fit_search(model_preset("gpt2"), g, a100, {}, fo);
  ASSERT_FALSE(on_t4.ranked.empty());
  ASSERT_FALSE(on_a100.ranked.empty());
  EXPECT_EQ(on_t4.ranked.front().policy.precision, Precision::fp16);
  EXPECT_EQ(on_a100.ranked.front().policy.precision, Precision::bf16);
  for (const FitCandidate& f : on_t4.ranked) EXPECT_NE(f.policy.precision, Precision::bf16) << f.family;
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
    if (seen) {
      EXPECT_TRUE(f.changes_training) << f.family;  // nothing unlabelled after a LoRA one
    }
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

// FSDP-QLoRA's headline: a 70B model fine-tuned on two 24 GB cards. Nothing that trains every
// weight fits there without offload, and neither does a 4-bit base held whole (35 GB); sharded
// by ZeRO-3 over the two ranks it does, so --fit proposes it, with the flags that run it, and
// the proposal plans to what it claimed.
TEST(LoraEstimate, FitProposesAQuantisedBaseShardedByZero3AcrossRanks) {
  Policy p;
  p.seq = 512;
  FitOptions fo;
  fo.keep = 20;
  Cluster c = one("rtx4090-24gb");
  c.gpus_per_node = 2;
  const FitResult r = fit_search(model_preset("llama-2-70b"), p, c, with_quant(), fo);
  const FitCandidate* sharded = nullptr;
  for (const FitCandidate& f : r.ranked) {
    if (!f.changes_training) {
      EXPECT_NE(f.policy.offload_params, Tier::device) << f.family;
      continue;
    }
    EXPECT_EQ(f.policy.offload_params, Tier::device) << f.family;
    EXPECT_TRUE(f.policy.quantize_base.enabled()) << f.family << ": a 70B base in bf16 cannot fit on two 24 GB cards";
    EXPECT_EQ(f.policy.zero_stage, 3) << f.family << ": a whole 4-bit 70B base is 35 GB";
    if (!sharded) sharded = &f;
  }
  ASSERT_NE(sharded, nullptr);
  const RankEstimate again = estimate_run(model_preset("llama-2-70b"), sharded->policy, c, with_quant());
  EXPECT_EQ(again.device_bytes, sharded->estimate.device_bytes);
  EXPECT_TRUE(check_fit(again, c, c.hw.memory_bytes).fits());
  const std::string text = format_fit(r, c, c.hw.memory_bytes);
  EXPECT_NE(text.find("--quantize-base nf4 --double-quant --zero 3)"), std::string::npos) << text;
}

}  // namespace
}  // namespace memfit
