#include "fit/framework_pytorch.hpp"

#include <algorithm>
#include <array>

#include <fmt/format.h>

#include "core/error.hpp"
#include "fit/framework_pytorch_order.hpp"
#include "fit/framework_pytorch_table.hpp"
#include "fit/hardware.hpp"
#include "fit/pytorch_allocation_order.hpp"

namespace memfit {

namespace tm = torch_model;

TorchAttention parse_torch_attention(std::string_view s) {
  if (s == "eager") return TorchAttention::eager;
  if (s == "sdpa") return TorchAttention::sdpa;
  throw Error("framework", fmt::format("unknown torch attention '{}' (eager or sdpa)", s));
}

std::string_view torch_attention_name(TorchAttention a) { return a == TorchAttention::eager ? "eager" : "sdpa"; }

std::optional<TorchStep> torch_step_for(const Policy& p, int world, std::optional<TorchAttention> attention,
                                        std::string& why) {
  why.clear();
  const RecomputeMode r = p.recompute.mode;
  if (p.precision == Precision::fp16) why = "fp16 (fp32 and bf16 autocast are modelled)";
  else if (r != RecomputeMode::none && r != RecomputeMode::full) why = "recomputation other than none or full";
  else if (p.optimizer != OptimizerKind::adamw) why = "8-bit AdamW";
  else if (p.zero_stage != 0 || p.offload_optimizer != Tier::device || p.offload_params != Tier::device)
    why = "ZeRO or offload (DeepSpeed's buffers)";
  else if (world != 1) why = "data parallelism (DDP's buckets)";
  else if (p.lora.rank != 0 || p.quantize_base.enabled() || !p.freeze.empty()) why = "LoRA or frozen parameters";
  else if (p.update_in_backward) why = "the update in backward";
  if (!why.empty()) return std::nullopt;
  TorchStep st;
  st.batch = p.batch, st.seq = p.seq;
  st.attention = attention ? *attention : p.attention == AttentionKind::flash ? TorchAttention::sdpa : TorchAttention::eager;
  st.checkpointing = r == RecomputeMode::full;
  st.autocast_bf16 = p.precision == Precision::bf16;
  return st;
}

TorchParameters torch_parameters(const ModelSpec& spec) {
  const int64_t L = spec.n_layer, C = spec.n_embd, F = spec.n_inner, V = spec.vocab_size;
  if (spec.arch == Arch::gpt2) {
    // wte, wpe; per block ln_1, c_attn, c_proj, ln_2, c_fc, mlp.c_proj (weight and bias each); ln_f
    const int64_t block = 4 * C + (3 * C * C + 3 * C) + (C * C + C) + (C * F + F) + (F * C + C);
    return {V * C + spec.max_seq * C + L * block + 2 * C, 2 + 12 * L + 2};
  }
  const int64_t kv = spec.n_kv_head * spec.head_dim(), bias = spec.qkv_bias ? 1 : 0;
  const int64_t block = 2 * C * C + 2 * C * kv + bias * (C + 2 * kv) + 3 * C * F + 2 * C;
  const int64_t untied = spec.tied_embeddings ? 0 : 1;
  return {V * C + L * block + C + untied * V * C, 1 + (9 + 3 * bias) * L + 1 + untied};
}

namespace {

using Monos = std::array<double, tm::kMonos>;

// Products in double: the largest (B x H x T x T, N x V) of real runs stay far below 2^53.
Monos monomials(const ModelSpec& s, const TorchStep& st) {
  const double B = double(st.batch), T = double(st.seq), N = B * T, C = double(s.n_embd), H = double(s.n_head);
  const double KV = double(s.n_kv_head), D = double(s.head_dim()), I = double(s.n_inner), V = double(s.vocab_size);
  Monos m{};
  m[tm::NC] = N * C, m[tm::NI] = N * I, m[tm::BHTT] = B * H * T * T, m[tm::NV] = N * V, m[tm::VC] = V * C;
  m[tm::N] = N, m[tm::BHT] = B * H * T, m[tm::TD] = T * D, m[tm::NKVD] = N * KV * D, m[tm::BTT] = B * T * T;
  m[tm::TT] = T * T, m[tm::CC] = C * C, m[tm::CI] = C * I, m[tm::NPC] = double(s.max_seq) * C;
  m[tm::CKVD] = C * KV * D, m[tm::KVD] = KV * D, m[tm::C] = C, m[tm::I] = I, m[tm::V] = V, m[tm::T] = T;
  m[tm::D] = D, m[tm::TC] = T * C, m[tm::NH] = N * H, m[tm::BKVTT] = B * KV * T * T, m[tm::HTT] = H * T * T;
  m[tm::B] = B, m[tm::One] = 1;
  // CUDA's sdpa (the memory-efficient and flash kernels, which handle dropout) keeps the
  // log-sum-exp of each row, B x H x T floats, where the CPU's math path keeps probabilities:
  // every T x T product goes; the log-sum-exp is within the table's BHT terms' reach (GPT-2
  // 12 x 768 at 4 x 512: 0.991 of CUDA's max_memory_allocated).
  if (st.cuda && st.attention == TorchAttention::sdpa)
    m[tm::BHTT] = m[tm::BTT] = m[tm::TT] = m[tm::BKVTT] = m[tm::HTT] = 0;
  return m;
}

struct Value {
  double total = 0, parameter_shaped = 0;
};

Value evaluate(const std::vector<tm::Term>& terms, const Monos& m, int64_t layers) {
  Value v;
  for (const tm::Term& t : terms) {
    const double bytes = (double(t.once) + double(t.per_extra_layer) * double(layers - 1)) * m[t.mono];
    v.total += bytes;
    if (tm::parameter_shaped(t.mono)) v.parameter_shaped += bytes;
  }
  return v;
}

}  // namespace

tm::Variant tm::variant_of(const ModelSpec& s, const TorchStep& st) {
  tm::Variant v;
  v.llama = s.arch == Arch::llama;
  v.eager = st.attention == TorchAttention::eager;
  v.checkpointing = st.checkpointing;
  v.bf16 = st.autocast_bf16;
  v.batch1 = st.batch == 1;
  v.mqa = v.llama && s.n_kv_head == 1 && s.n_head > 1 && st.batch == 1;
  v.gqa = v.llama && s.n_kv_head < s.n_head && !v.mqa;
  v.tied = v.llama && s.tied_embeddings;
  return v;
}

namespace {

void check_covered(const ModelSpec& s, const TorchStep& st) {
  MEMFIT_CHECK(st.batch >= 1 && st.seq >= 1, "framework", "batch and sequence must be at least 1 (got {} x {})",
               st.batch, st.seq);
  MEMFIT_CHECK(st.seq <= s.max_seq, "framework", "sequence {} is longer than the model's {} positions", st.seq,
               s.max_seq);
  MEMFIT_CHECK(s.arch == Arch::llama || s.tied_embeddings, "framework",
               "HF's GPT-2 ties its embeddings; an untied GPT-2 is not covered");
  MEMFIT_CHECK(!s.qkv_bias, "framework", "q/k/v biases (qwen2) are not covered by the PyTorch prediction");
}

// Every variant is traced (tools/derive_pytorch_memory_model.py); a missing one is a table bug
// or a table written with --skip-missing.
const tm::Variant* find_variant(const std::vector<tm::Entry>& table, tm::Variant v) {
  for (const tm::Entry& e : table)
    if (e.variant == v) return &e.variant;
  return nullptr;
}

}  // namespace

namespace {

const std::vector<tm::Entry>& covered_table(const ModelSpec& spec, const TorchStep& step, const tm::Variant*& variant) {
  check_covered(spec, step);
  const std::vector<tm::Entry>& table = spec.arch == Arch::gpt2 ? tm::gpt2_entries() : tm::llama_entries();
  variant = find_variant(table, tm::variant_of(spec, step));
  MEMFIT_CHECK(variant != nullptr, "framework", "no PyTorch memory model for this combination of attention {}, "
               "checkpointing {}, autocast {}", torch_attention_name(step.attention), step.checkpointing,
               step.autocast_bf16);
  return table;
}

}  // namespace

uint64_t pytorch_activation_peak(const ModelSpec& spec, const TorchStep& step) {
  const tm::Variant* variant = nullptr;
  const std::vector<tm::Entry>& table = covered_table(spec, step, variant);
  const Monos m = monomials(spec, step);
  double best = 0;
  for (const tm::Entry& e : table) {
    if (!(e.variant == *variant) || e.phase == tm::Phase::saved || (e.two_layers && spec.n_layer < 2)) continue;
    const Value v = evaluate(e.terms, m, spec.n_layer);
    best = std::max(best, v.total - v.parameter_shaped);
  }
  return uint64_t(best);
}

TorchPeak predict_pytorch_peak(const ModelSpec& spec, const TorchStep& step) {
  const tm::Variant* variant = nullptr;
  const std::vector<tm::Entry>& table = covered_table(spec, step, variant);
  const Monos m = monomials(spec, step);
  const TorchParameters params = torch_parameters(spec);
  const double P = 4.0 * double(params.elements), N = double(step.batch) * double(step.seq);

  TorchPeak out;
  out.parameters = uint64_t(P) + (spec.arch == Arch::llama ? uint64_t(4 * spec.head_dim()) : 0);
  out.optimizer_state = uint64_t(2 * P) + uint64_t(4 * params.tensors);
  out.inputs = uint64_t(8 * N);
  const double fixed = double(out.parameters + out.optimizer_state + out.inputs);

  Value saved, best{-1, 0};
  const tm::Entry* at = nullptr;
  for (const tm::Entry& e : table) {
    if (!(e.variant == *variant)) continue;
    if (e.phase == tm::Phase::saved) {
      saved = evaluate(e.terms, m, spec.n_layer);
      continue;
    }
    if (e.two_layers && spec.n_layer < 2) continue;
    const Value v = evaluate(e.terms, m, spec.n_layer);
    if (v.total > best.total) best = v, at = &e;
  }
  // AdamW(foreach): the gradients plus one parameter-sized temporary of the fused updates.
  const double optimizer = 2 * P + 16;
  out.cublas_workspaces = step.cuda ? 2 * step.cublas_workspace_bytes : 0;
  out.peak = uint64_t(fixed + std::max(optimizer, best.total)) + out.cublas_workspaces;
  if (optimizer >= best.total) {
    out.phase = "optimizer", out.where = "AdamW foreach update";
    out.gradients = uint64_t(P);
  } else {
    out.phase = at->phase == tm::Phase::forward ? "forward" : "backward", out.where = at->where;
    out.gradients = uint64_t(std::max(0.0, best.parameter_shaped));
    const double activations = std::max(0.0, best.total - best.parameter_shaped);
    out.saved_activations = uint64_t(std::min(activations, std::max(0.0, saved.total - saved.parameter_shaped)));
  }
  const uint64_t counted = uint64_t(fixed) + out.gradients + out.saved_activations + out.cublas_workspaces;
  out.transient = out.peak > counted ? out.peak - counted : 0;
  if (step.cuda) {
    try {
      const TorchReserve r = predict_pytorch_reserved(spec, step);
      out.max_memory_reserved = r.max_memory_reserved;
      out.order_allocated = r.max_memory_allocated;
    } catch (const Error& e) {
      out.reserved_why = e.what();
    }
  }
  return out;
}

TorchStep on_hardware(TorchStep step, const Hardware& hw) {
  step.cuda = !hw.executes_here;
  step.cublas_workspace_bytes = step.cuda ? hw.gemm_workspace_bytes : 0;
  step.hopper = step.cuda && (hw.name == "h100-80gb" || hw.name == "h200-141gb");
  return step;
}

uint64_t torch_runtime_bytes(const Cluster& cluster) {
  return cluster.fixed_overhead_bytes() - (cluster.hw.executes_here ? 0 : cluster.hw.gemm_workspace_bytes);
}

std::string format_pytorch_peak(const ModelSpec& spec, const TorchStep& step, const TorchPeak& p) {
  std::string s = fmt::format(
      "PyTorch + HF transformers{} (predicted): model {} ({} parameters), batch {} x {}, attention {}, {}, {}\n",
      step.cuda ? " on CUDA" : "", spec.name, torch_parameters(spec).elements, step.batch, step.seq,
      torch_attention_name(step.attention), step.autocast_bf16 ? "bf16 autocast" : "fp32",
      step.checkpointing ? "gradient checkpointing" : "no checkpointing");
  auto row = [&](std::string_view name, uint64_t bytes) {
    s += fmt::format("  {:<20} {:>14} B  {:>10.1f} MiB\n", name, bytes, double(bytes) / (1 << 20));
  };
  row("parameters", p.parameters);
  row("optimizer state", p.optimizer_state);
  row("token ids", p.inputs);
  row("gradients", p.gradients);
  row("saved activations", p.saved_activations);
  row("transient", p.transient);
  if (step.cuda) row("cuBLAS workspaces", p.cublas_workspaces);
  row("peak", p.peak);
  if (step.cuda && p.max_memory_reserved) row("reserved", p.max_memory_reserved);
  if (!step.cuda) {
    s += fmt::format("  peak in the {} ({}); torch CPU tensor bytes of a steady-state step (step 2+, AdamW foreach)\n",
                     p.phase, p.where);
    return s;
  }
  s += fmt::format("  peak in the {} ({}); torch.cuda.max_memory_allocated of a steady-state step (step 2+, AdamW "
                   "foreach)\n",
                   p.phase, p.where);
  if (p.max_memory_reserved)
    s += fmt::format("  reserved: torch.cuda.max_memory_reserved of the model's load and two steps, their allocation "
                     "order replayed through the caching allocator's model ({:.3f}x the peak; the order's own "
                     "max_memory_allocated {}); the CUDA context is not counted\n",
                     double(p.max_memory_reserved) / double(p.peak), p.order_allocated);
  else
    s += fmt::format("  max_memory_reserved is not predicted: {}; the CUDA context is not counted\n", p.reserved_why);
  return s;
}

nlohmann::json pytorch_peak_json(const TorchStep& step, const TorchPeak& p) {
  return {{"batch", step.batch},
          {"seq", step.seq},
          {"attention", torch_attention_name(step.attention)},
          {"checkpointing", step.checkpointing},
          {"autocast", step.autocast_bf16 ? "bf16" : "none"},
          {"device", step.cuda ? "cuda" : "cpu"},
          {"peak_bytes", p.peak},
          {"measure", step.cuda ? "torch.cuda.max_memory_allocated" : "torch CPU tensor bytes (profiler)"},
          {"phase", p.phase},
          {"where", p.where},
          {"max_memory_reserved", p.max_memory_reserved ? nlohmann::json(p.max_memory_reserved) : nlohmann::json()},
          {"max_memory_reserved_why", p.reserved_why},
          {"order_max_memory_allocated", p.order_allocated ? nlohmann::json(p.order_allocated) : nlohmann::json()},
          {"breakdown",
           {{"parameters", p.parameters},
            {"optimizer_state", p.optimizer_state},
            {"inputs", p.inputs},
            {"gradients", p.gradients},
            {"saved_activations", p.saved_activations},
            {"transient", p.transient},
            {"cublas_workspaces", p.cublas_workspaces}}}};
}

}  // namespace memfit
