#include "fit/lora_estimate.hpp"

#include <algorithm>
#include <map>
#include <regex>
#include <set>

#include "core/error.hpp"
#include "graph/builder.hpp"
#include "graph/model_forward.hpp"
#include "graph/optimizer.hpp"
#include "graph/precision.hpp"
#include "graph/recompute.hpp"
#include "graph/training_program.hpp"

namespace memfit {

std::vector<LoraLinear> model_linears(const ModelSpec& s) {
  std::vector<LoraLinear> out;
  const int64_t C = s.n_embd, F = s.n_inner, HS = s.head_dim();
  for (int l = 0; l < int(s.n_layer); ++l) {
    if (s.arch == Arch::llama) {
      const std::string m = fmt::format("model.layers.{}.", l), p = fmt::format("layers.{}.", l);
      const std::string qkv = p + "self_attn.qkv_proj.weight", qkv_bias = s.qkv_bias ? p + "self_attn.qkv_proj.bias" : "";
      out.push_back({m + "self_attn.q_proj", qkv, qkv_bias, l, C, s.n_head * HS});
      out.push_back({m + "self_attn.k_proj", qkv, qkv_bias, l, C, s.n_kv_head * HS});
      out.push_back({m + "self_attn.v_proj", qkv, qkv_bias, l, C, s.n_kv_head * HS});
      out.push_back({m + "self_attn.o_proj", p + "self_attn.o_proj.weight", "", l, s.n_head * HS, C});
      out.push_back({m + "mlp.gate_proj", p + "mlp.gate_proj.weight", "", l, C, F});
      out.push_back({m + "mlp.up_proj", p + "mlp.up_proj.weight", "", l, C, F});
      out.push_back({m + "mlp.down_proj", p + "mlp.down_proj.weight", "", l, F, C});
    } else {
      const std::string m = fmt::format("transformer.h.{}.", l), p = fmt::format("h.{}.", l);
      const auto add = [&](const std::string& module, int64_t in, int64_t out_features) {
        out.push_back({m + module, p + module + ".weight", p + module + ".bias", l, in, out_features});
      };
      add("attn.c_attn", C, 3 * C);
      add("attn.c_proj", C, C);
      add("mlp.c_fc", C, F);
      add("mlp.c_proj", F, C);
    }
  }
  return out;
}

std::vector<std::string> default_lora_targets(const ModelSpec& spec) {
  if (spec.arch == Arch::gpt2) return {"c_attn"};
  return {"q_proj", "v_proj"};
}

namespace {

// The last component of each module path, once each, in model order ("q_proj", "c_attn").
std::string short_names(const std::vector<LoraLinear>& linears) {
  std::vector<std::string> names;
  for (const LoraLinear& l : linears) {
    const std::string n = l.module.substr(l.module.rfind('.') + 1);
    if (std::find(names.begin(), names.end(), n) == names.end()) names.push_back(n);
  }
  return fmt::format("{}", fmt::join(names, ", "));
}

bool matches_name(const std::string& module, const std::string& target) {
  return module == target || module.ends_with("." + target);
}

}  // namespace

std::vector<LoraLinear> lora_targets(const ModelSpec& spec, const LoraPolicy& lora) {
  MEMFIT_CHECK(lora.rank >= 1, "policy", "LoRA rank must be at least 1 (got {})", lora.rank);
  MEMFIT_CHECK(lora.dropout >= 0 && lora.dropout < 1, "policy", "LoRA dropout must be in [0, 1) (got {})", lora.dropout);
  const std::vector<LoraLinear> linears = model_linears(spec);
  std::vector<char> chosen(linears.size(), 0);
  if (!lora.target_regex.empty()) {
    std::regex re;
    try {
      re = std::regex(lora.target_regex);
    } catch (const std::regex_error& e) {
      throw Error("policy", fmt::format("LoRA target_regex '{}' is not a regular expression ({})", lora.target_regex,
                                        e.what()));
    }
    for (size_t i = 0; i < linears.size(); ++i) chosen[i] = std::regex_match(linears[i].module, re);
    MEMFIT_CHECK(std::count(chosen.begin(), chosen.end(), 1) > 0, "policy",
                 "LoRA target_regex '{}' matches no linear layer of {} (paths look like '{}')", lora.target_regex,
                 spec.name, linears.empty() ? "" : linears.front().module);
  } else {
    const std::vector<std::string> targets = lora.targets.empty() ? default_lora_targets(spec) : lora.targets;
    for (const std::string& t : targets) {
      bool any = false;
      for (size_t i = 0; i < linears.size(); ++i)
        if (t == "all-linear" || matches_name(linears[i].module, t)) chosen[i] = any = true;
      MEMFIT_CHECK(any, "policy", "LoRA target '{}' matches no linear layer of {} (its linear layers: {}; or all-linear)",
                   t, spec.name, short_names(linears));
    }
  }
  std::vector<LoraLinear> out;
  for (size_t i = 0; i < linears.size(); ++i) {
    if (!chosen[i]) continue;
    const LoraLinear& l = linears[i];
    MEMFIT_CHECK(lora.rank <= std::min(l.in, l.out), "policy",
                 "LoRA rank {} is larger than min(in, out) = {} of {} ({} -> {} features)", lora.rank,
                 std::min(l.in, l.out), l.module, l.in, l.out);
    out.push_back(l);
  }
  return out;
}

Policy lora_proxy_policy(const ModelSpec& spec, const Policy& policy) {
  Policy q = policy;
  q.lora = LoraPolicy{};
  q.quantize_base = BaseQuantPolicy{};
  if (!policy.lora.enabled()) return q;  // a quantised base under --freeze: the freeze run itself
  std::set<std::string> trainable;
  for (const LoraLinear& t : lora_targets(spec, policy.lora)) {
    trainable.insert(t.param);
    if (policy.lora.bias == LoraBias::lora_only && !t.bias.empty()) trainable.insert(t.bias);
  }
  Program names;
  GraphBuilder b(names);
  declare_model_parameters(b, spec);
  q.freeze.clear();
  for (const ParamEntry& e : names.params()) {
    const bool bias = policy.lora.bias == LoraBias::all && e.name.ends_with(".bias");
    if (!bias && !trainable.contains(e.name)) q.freeze.push_back(e.name);
  }
  return q;
}

namespace {

using Bytes = std::array<uint64_t, kNumCategories>;

Bytes category_bytes(const StateElements& st) {
  Bytes b{};
  for (const auto& [key, n] : st) b[size_t(key.first)] += dtype_bytes(key.second, n);
  return b;
}

// A trainable parameter of n elements as the builder declares it: value in the compute dtype,
// gradient, fp32 master under 16-bit compute, AdamW state (8-bit from kMin8bitElements on).
void add_trainable(StateElements& st, const Policy& policy, int64_t n) {
  const DType cdt = compute_dtype(policy.precision);
  st[{Category::parameters, cdt}] += n;
  st[{Category::gradients, cdt == DType::f32 ? DType::f32 : policy.grad_dtype}] += n;
  if (cdt != DType::f32) st[{Category::master_weights, DType::f32}] += n;
  if (policy.optimizer == OptimizerKind::adamw8bit && n >= kMin8bitElements) {
    st[{Category::optimizer_state, DType::u8}] += 2 * n;
    st[{Category::optimizer_state, DType::f32}] += 2 * ((n + kQuantBlock - 1) / kQuantBlock);
  } else {
    st[{Category::optimizer_state, DType::f32}] += 2 * n;
  }
}

// The model states of the LoRA run, from the proxy's parameters; fills the breakdown's bytes.
StateElements lora_states(const Program& p, const Policy& policy, const std::vector<LoraLinear>& targets,
                          const std::set<std::string>& linear_params, const QuantStorageFn& storage,
                          LoraBreakdown& br) {
  std::set<std::string> targeted;
  for (const LoraLinear& t : targets) targeted.insert(t.param);
  const bool quant = policy.quantize_base.enabled();
  StateElements st;
  auto add = [&](TensorId id) {
    if (id == kNoTensor) return;
    const TensorDesc& t = p.tensor(id);
    st[{t.category, t.dtype}] += t.numel();
  };
  for (const ParamEntry& e : p.params()) {
    if (e.trainable && !targeted.contains(e.name)) {  // trained as it is (a bias under bias=all)
      for (const StoredTensor& s : e.storage) add(s.id);
      add(e.grad);
      add(e.master);
      for (TensorId s : e.state) add(s);
      continue;
    }
    const TensorDesc& v = p.tensor(e.value);
    if (quant && linear_params.contains(e.name)) {
      const QuantParts q = storage(policy.quantize_base, v.numel());
      const bool dq = policy.quantize_base.double_quant;
      // Codes (and double quantisation's 8-bit absmax codes) are bytes; the rest fp32.
      st[{Category::parameters, DType::u8}] += int64_t(q.codes + (dq ? q.absmax : 0));
      st[{Category::parameters, DType::f32}] += int64_t(((dq ? 0 : q.absmax) + q.absmax2 + q.offset) / 4);
      br.quantized_bytes += q.total();
      ++br.quantized_tensors;
      br.quantized_elements += v.numel();
    } else {
      add(e.value);
      br.frozen_bytes += v.bytes();
    }
  }
  StateElements adapters;
  for (const LoraLinear& t : targets) {
    add_trainable(adapters, policy, policy.lora.rank * t.in);   // A [r, in]
    add_trainable(adapters, policy, t.out * policy.lora.rank);  // B [out, r]
    br.adapter_elements += policy.lora.rank * (t.in + t.out);
  }
  br.adapter_bytes = category_bytes(adapters);
  for (const auto& [key, n] : adapters) st[key] += n;
  return st;
}

// Where each block's LoRA-branch tensors live: from the block's forward (or, recomputed whole,
// from its recompute) to the end of its backward, over the micro section.
struct BlockSpans {
  std::vector<int> first_forward, first_recompute, last_backward;
};

BlockSpans block_spans(const Program& p, int layers) {
  BlockSpans b{std::vector<int>(size_t(layers), -1), std::vector<int>(size_t(layers), -1),
               std::vector<int>(size_t(layers), -1)};
  for (int i = 0; i < int(p.ops().size()); ++i) {
    const Op& op = p.op(i);
    const int section = p.section_of_op(i);
    if (op.layer < 0 || op.layer >= layers || section < 0 || p.sections()[size_t(section)].kind != SectionKind::micro)
      continue;
    const size_t l = size_t(op.layer);
    if (op.phase == Phase::forward && b.first_forward[l] < 0) b.first_forward[l] = i;
    if (op.phase == Phase::recompute && b.first_recompute[l] < 0) b.first_recompute[l] = i;
    if (op.phase == Phase::backward) b.last_backward[l] = i;
  }
  return b;
}

// Adds the LoRA branch's saved tensors and the quantised products' temporaries to every op's
// live bytes.
void add_branch_and_tiles(const Program& p, const ModelSpec& spec, const Policy& policy,
                          const std::vector<LoraLinear>& targets, const std::vector<LoraLinear>& quantized,
                          ProgramSummary& s) {
  const DType cdt = compute_dtype(policy.precision);
  const int layers = int(spec.n_layer);
  const int64_t tokens = policy.batch * policy.seq;
  std::vector<uint64_t> branch(size_t(layers), 0);
  for (const LoraLinear& t : targets) {
    branch[size_t(t.layer)] += dtype_bytes(cdt, tokens * policy.lora.rank);
    if (policy.lora.dropout > 0) branch[size_t(t.layer)] += dtype_bytes(cdt, tokens * t.in);
  }
  for (uint64_t b : branch) s.lora.branch_bytes += b;
  for (const LoraLinear& q : quantized) {
    s.lora.tile_bytes = std::max(s.lora.tile_bytes, dtype_bytes(cdt, std::min(kQuantTileRows, q.out) * q.in));
    if (cdt != DType::f32) s.lora.input_grad_bytes = std::max(s.lora.input_grad_bytes, dtype_bytes(DType::f32, tokens * q.in));
  }
  const std::vector<BlockRecompute> blocks = resolve_recompute(policy.recompute, spec.n_layer);
  const BlockSpans spans = block_spans(p, layers);
  const size_t n = s.live.size();
  // Difference arrays over ops, one per category the branch lands in.
  std::vector<int64_t> saved(n + 1, 0), recomputed(n + 1, 0);
  for (int l = 0; l < layers; ++l) {
    const bool whole = blocks[size_t(l)].whole && spans.first_recompute[size_t(l)] >= 0;
    const int begin = whole ? spans.first_recompute[size_t(l)] : spans.first_forward[size_t(l)];
    const int end = spans.last_backward[size_t(l)];
    if (branch[size_t(l)] == 0 || begin < 0 || end < begin) continue;
    std::vector<int64_t>& d = whole ? recomputed : saved;
    d[size_t(begin)] += int64_t(branch[size_t(l)]);
    d[size_t(end) + 1] -= int64_t(branch[size_t(l)]);
  }
  int64_t act = 0, tmp = 0;
  for (size_t i = 0; i < n; ++i) {
    act += saved[i];
    tmp += recomputed[i];
    CategoryBytes& live = s.live[i];
    live[size_t(Category::activations)] += uint64_t(act);
    live[size_t(Category::temporaries)] += uint64_t(tmp);
    const Op& op = p.op(int(i));
    if (op.layer >= 0 && op.phase != Phase::optimizer) {
      live[size_t(Category::temporaries)] += s.lora.tile_bytes;
      if (op.phase == Phase::backward) live[size_t(Category::temporaries)] += s.lora.input_grad_bytes;
    }
  }
}

// The summary's peaks again, after its per-op live bytes changed (the proxy's packing kept).
void repeak(ProgramSummary& s) {
  uint64_t best = 0;
  size_t at = 0;
  s.category_peak = {};
  for (size_t i = 0; i < s.live.size(); ++i) {
    uint64_t total = 0;
    for (size_t c = 0; c < kNumCategories; ++c) {
      total += s.live[i][c];
      s.category_peak[c] = std::max(s.category_peak[c], s.live[i][c]);
    }
    if (total > best) {
      best = total;
      at = i;
    }
  }
  s.plan_peak = best + s.packing_overhead;
  s.tier_peak[size_t(Tier::device)] = s.plan_peak;
  if (!s.live.empty()) s.tier_at_peak[size_t(Tier::device)] = s.live[at];
}

// Step time: the targeted weights' gradient products out, the optimizer on the adapters' share,
// the adapters' products and the dequantisation of every quantised weight in.
void retime(const Program& p, const ModelSpec& spec, const Policy& policy, const std::vector<LoraLinear>& targets,
            const std::vector<LoraLinear>& quantized, const LoraBreakdown& br, const Hardware& hw,
            const EstimateOptions& o, ProgramSummary& s) {
  std::set<TensorId> base_grads;
  std::set<std::string> targeted;
  for (const LoraLinear& t : targets) targeted.insert(t.param);
  int64_t proxy_trainable = 0, kept_trainable = 0;
  for (const ParamEntry& e : p.params()) {
    if (!e.trainable) continue;
    proxy_trainable += p.param_numel(e);
    if (targeted.contains(e.name)) base_grads.insert(e.grad);
    else kept_trainable += p.param_numel(e);
  }
  for (int i = 0; i < int(p.ops().size()); ++i) {
    const Op& op = p.op(i);
    const int section = p.section_of_op(i);
    if (section < 0 || p.sections()[size_t(section)].kind != SectionKind::micro) continue;
    if (std::none_of(op.outputs.begin(), op.outputs.end(), [&](TensorId t) { return base_grads.contains(t); })) continue;
    s.micro_seconds -= op_seconds(p, op, hw, o.efficiency);
    s.micro_flops -= op.flops;
  }
  if (proxy_trainable > 0) {
    const double share = double(kept_trainable + br.adapter_elements) / double(proxy_trainable);
    s.optimizer_seconds *= share;
    s.optimizer_flops *= share;
    s.optimizer_bytes *= share;
  }
  const DType cdt = compute_dtype(policy.precision);
  const double e = double(dtype_bytes(cdt, 1)), m = double(policy.batch * policy.seq), r = double(policy.lora.rank);
  const std::vector<BlockRecompute> blocks = resolve_recompute(policy.recompute, spec.n_layer);
  for (const LoraLinear& t : targets) {
    const double in = double(t.in), out = double(t.out);
    // x A^T, then (x A^T) B^T scaled, then added to the base product; backward twice the work.
    const double forward = roofline_seconds(2 * m * r * in, e * (m * in + r * in + m * r), cdt, hw, o.efficiency) +
                           roofline_seconds(2 * m * r * out, e * (m * r + r * out + m * out), cdt, hw, o.efficiency) +
                           roofline_seconds(m * out, 3 * e * m * out, cdt, hw, o.efficiency);
    s.micro_seconds += 3 * forward;
    s.micro_flops += 3 * (2 * m * r * (in + out) + m * out);
    if (blocks[size_t(t.layer)].whole) {
      s.recompute_seconds += forward;
      s.recompute_flops += 2 * m * r * (in + out) + m * out;
    }
  }
  if (!quantized.empty()) {
    for (const LoraLinear& q : quantized) {
      const double numel = double(q.in) * double(q.out);
      // Codes and scales read, the tile written and read back by the product: forward and
      // input gradient, and once more where the block is recomputed.
      const double pass = roofline_seconds(0, double(o.quant_storage(policy.quantize_base, int64_t(numel)).total()) + 2 * e * numel, cdt, hw,
                                           o.efficiency);
      s.micro_seconds += 2 * pass;
      if (blocks[size_t(q.layer)].whole) s.recompute_seconds += pass;
    }
  }
}

// The quantised base linears, one per memfit parameter (q, k and v share one).
std::vector<LoraLinear> quantized_linears(const Program& p, const ModelSpec& spec, const Policy& policy,
                                          const std::vector<LoraLinear>& targets) {
  std::vector<LoraLinear> out;
  if (!policy.quantize_base.enabled()) return out;
  std::set<std::string> targeted, seen;
  for (const LoraLinear& t : targets) targeted.insert(t.param);
  std::map<std::string, Shape> frozen;
  for (const ParamEntry& e : p.params())
    if (!e.trainable || targeted.contains(e.name)) frozen.emplace(e.name, p.tensor(e.value).shape);
  for (const LoraLinear& l : model_linears(spec)) {
    const auto it = frozen.find(l.param);
    if (it == frozen.end() || !seen.insert(l.param).second) continue;
    LoraLinear q = l;
    q.out = it->second[0];  // rows of the stored parameter (the fused q/k/v projection)
    q.in = it->second[1];
    out.push_back(q);
  }
  return out;
}

}  // namespace

ProgramSummary plan_lora_summary(const ModelSpec& spec, const Policy& policy, const Hardware& hw,
                                 const EstimateOptions& options) {
  MEMFIT_CHECK(!policy.quantize_base.enabled() || policy.lora.enabled() || !policy.freeze.empty(), "policy",
               "--quantize-base {} quantises frozen base weights: add LoRA (--lora-rank) or --freeze",
               base_quant_name(policy.quantize_base.kind));
  MEMFIT_CHECK(!policy.quantize_base.enabled() || options.quant_storage, "fit",
               "a quantised base is estimated with kernels/quant's storage sizes: EstimateOptions::quant_storage is unset");
  const std::vector<LoraLinear> targets =
      policy.lora.enabled() ? lora_targets(spec, policy.lora) : std::vector<LoraLinear>{};
  Program p = build_training_program(spec, lora_proxy_policy(spec, planning_policy(policy)), Topology{},
                                     hw.capabilities);
  if (options.prepare) options.prepare(p);
  ProgramSummary s = summarize_program(p, plan_memory(p, options.alignments), hw, options);

  LoraBreakdown& br = s.lora;
  br.on = true;
  br.adapters = int(targets.size());
  br.rank = policy.lora.rank;
  if (policy.quantize_base.enabled())
    br.quant = fmt::format("{}, block {}{}", base_quant_name(policy.quantize_base.kind), policy.quantize_base.block,
                           policy.quantize_base.double_quant ? ", double quantisation" : "");
  std::set<std::string> linear_params;
  for (const LoraLinear& l : model_linears(spec)) linear_params.insert(l.param);
  const StateElements states = lora_states(p, policy, targets, linear_params, options.quant_storage, br);
  const Bytes before = category_bytes(s.states), after = category_bytes(states);
  for (CategoryBytes& live : s.live)
    for (Category c : {Category::parameters, Category::gradients, Category::master_weights, Category::optimizer_state}) {
      const size_t i = size_t(c);
      // Each model-state category's live bytes scale with its new total (transient gradients too).
      live[i] = before[i] > 0 ? uint64_t(double(live[i]) * double(after[i]) / double(before[i]) + 0.5) : live[i] + after[i];
    }
  s.states = states;
  const std::vector<LoraLinear> quantized = quantized_linears(p, spec, policy, targets);
  add_branch_and_tiles(p, spec, policy, targets, quantized, s);
  repeak(s);
  retime(p, spec, policy, targets, quantized, br, hw, options, s);
  return s;
}

}  // namespace memfit
