#include "graph/policy.hpp"

#include <charconv>
#include <cmath>
#include <regex>

#include "core/error.hpp"

namespace memfit {

std::string_view precision_name(Precision p) {
  switch (p) {
    case Precision::fp32: return "fp32";
    case Precision::bf16: return "bf16";
    case Precision::fp16: return "fp16";
  }
  return "?";
}

Precision parse_precision(std::string_view s) {
  if (s == "fp32" || s == "float32") return Precision::fp32;
  if (s == "bf16" || s == "bfloat16") return Precision::bf16;
  if (s == "fp16" || s == "float16") return Precision::fp16;
  throw Error("policy", fmt::format("unknown precision '{}' (expected fp32, bf16 or fp16)", s));
}

std::string_view attention_name(AttentionKind a) { return a == AttentionKind::plain ? "plain" : "flash"; }

AttentionKind parse_attention(std::string_view s) {
  if (s == "plain" || s == "naive") return AttentionKind::plain;  // "naive": the name before 0.2
  if (s == "flash") return AttentionKind::flash;
  throw Error("policy", fmt::format("unknown attention '{}' (expected plain or flash)", s));
}

std::string_view optimizer_name(OptimizerKind o) { return o == OptimizerKind::adamw ? "adamw" : "adamw8bit"; }

OptimizerKind parse_optimizer(std::string_view s) {
  if (s == "adamw") return OptimizerKind::adamw;
  if (s == "adamw8bit") return OptimizerKind::adamw8bit;
  throw Error("policy", fmt::format("unknown optimizer '{}' (expected adamw or adamw8bit)", s));
}

std::string_view lora_bias_name(LoraBias b) {
  switch (b) {
    case LoraBias::none: return "none";
    case LoraBias::all: return "all";
    case LoraBias::lora_only: return "lora_only";
  }
  return "?";
}

LoraBias parse_lora_bias(std::string_view s) {
  if (s == "none") return LoraBias::none;
  if (s == "all") return LoraBias::all;
  if (s == "lora_only") return LoraBias::lora_only;
  throw Error("policy", fmt::format("unknown LoRA bias '{}' (expected none, all or lora_only, as PEFT)", s));
}

std::string lora_init_name(const LoraPolicy& l) {
  switch (l.init) {
    case LoraInit::peft_default: return "true";
    case LoraInit::gaussian: return "gaussian";
    case LoraInit::random: return "false";
    case LoraInit::olora: return "olora";
    case LoraInit::pissa: return l.pissa_niter < 0 ? "pissa" : fmt::format("pissa_niter_{}", l.pissa_niter);
  }
  return "?";
}

bool parse_lora_init(std::string_view s, LoraPolicy& l) {
  l.pissa_niter = -1;
  if (s == "true") l.init = LoraInit::peft_default;
  else if (s == "gaussian") l.init = LoraInit::gaussian;
  else if (s == "false") l.init = LoraInit::random;
  else if (s == "olora") l.init = LoraInit::olora;
  else if (s == "pissa") l.init = LoraInit::pissa;
  else if (s.starts_with("pissa_niter_")) {
    const std::string_view n = s.substr(12);
    int v = 0;
    const auto [end, ec] = std::from_chars(n.data(), n.data() + n.size(), v);
    MEMFIT_CHECK(ec == std::errc() && end == n.data() + n.size() && v >= 0 && v <= 10000, "policy",
                 "init_lora_weights '{}': expected pissa_niter_N with N a count of iterations in [0, 10000]", s);
    l.init = LoraInit::pissa;
    l.pissa_niter = v;
  } else {
    return false;
  }
  return true;
}

namespace {

// The value of the one pattern key matching `path` as PEFT's get_pattern_key matches, else `fallback`.
template <class T>
T pattern_value(const std::vector<std::pair<std::string, T>>& pattern, const std::string& path, T fallback,
                const char* what) {
  const std::string* found = nullptr;
  T value = fallback;
  for (const auto& [key, v] : pattern) {
    std::regex re;
    try {
      re = std::regex("(.*\\.)?(" + key + ")$", std::regex::ECMAScript);
    } catch (const std::regex_error&) {
      throw Error("policy", fmt::format("LoRA {} key '{}' is not a valid regular expression", what, key));
    }
    if (!std::regex_match(path, re)) continue;
    MEMFIT_CHECK(found == nullptr, "policy", "LoRA {} keys '{}' and '{}' both match module {}: name it by one", what,
                 *found, key, path);
    found = &key;
    value = v;
  }
  return value;
}

}  // namespace

int64_t LoraPolicy::rank_of(const std::string& hf_path) const {
  return pattern_value(rank_pattern, hf_path, rank, "rank_pattern");
}

double LoraPolicy::scale_of(const std::string& hf_path) const {
  const double r = double(rank_of(hf_path)), a = pattern_value(alpha_pattern, hf_path, alpha, "alpha_pattern");
  return rslora ? a / std::sqrt(r) : a / r;
}

std::string_view base_quant_name(BaseQuant q) {
  switch (q) {
    case BaseQuant::none: return "none";
    case BaseQuant::nf4: return "nf4";
    case BaseQuant::fp4: return "fp4";
    case BaseQuant::int8: return "int8";
  }
  return "?";
}

BaseQuant parse_base_quant(std::string_view s) {
  if (s == "none") return BaseQuant::none;
  if (s == "nf4") return BaseQuant::nf4;
  if (s == "fp4") return BaseQuant::fp4;
  if (s == "int8") return BaseQuant::int8;
  throw Error("policy", fmt::format("unknown base quantisation '{}' (expected nf4, fp4, int8 or none)", s));
}

std::string blocks_to_string(const std::vector<BlockRecompute>& blocks) {
  // Runs of equal blocks: "full x2,attention+norms x10".
  auto one = [](const BlockRecompute& b) {
    if (b.whole) return std::string(b.keep_input ? "full" : "whole");
    std::string s;
    for (auto [on, name] : {std::pair{b.attention, "attention"}, {b.mlp_activation, "mlp_activation"}, {b.norms, "norms"}})
      if (on) s += fmt::format("{}{}", s.empty() ? "" : "+", name);
    return s.empty() ? std::string("none") : s;
  };
  std::string out;
  for (size_t i = 0; i < blocks.size();) {
    size_t j = i;
    while (j < blocks.size() && blocks[j] == blocks[i]) ++j;
    out += fmt::format("{}{} x{}", out.empty() ? "" : ",", one(blocks[i]), j - i);
    i = j;
  }
  return out;
}

std::string RecomputePolicy::to_string() const {
  switch (mode) {
    case RecomputeMode::none: return "none";
    case RecomputeMode::full: return "full";
    case RecomputeMode::every: return every > 0 ? fmt::format("every:{}", every) : "every:sqrt";
    case RecomputeMode::automatic: return blocks.empty() ? "auto" : "auto:" + blocks_to_string(blocks);
    case RecomputeMode::selective: {
      std::string s = "selective";
      for (size_t i = 0; i < ops.size(); ++i) s += (i ? "," : ":") + ops[i];
      return s;
    }
  }
  return "?";
}

namespace {

// One run of blocks_to_string's output, "attention+norms x10", appended to `out`.
void parse_block_run(std::string_view run, std::string_view whole_text, std::vector<BlockRecompute>& out) {
  const auto x = run.rfind(" x");
  int count = 0;
  const std::string_view n = x == std::string_view::npos ? std::string_view{} : run.substr(x + 2);
  auto [end, ec] = std::from_chars(n.data(), n.data() + n.size(), count);
  MEMFIT_CHECK(x != std::string_view::npos && ec == std::errc() && end == n.data() + n.size() && count >= 1, "policy",
               "recompute choice '{}': '{}' is not '<what> x<count>'", whole_text, run);
  BlockRecompute b;
  const std::string_view what = run.substr(0, x);
  if (what == "full" || what == "whole") {
    b.whole = true;
    b.keep_input = what == "full";
  } else if (what != "none") {
    for (std::string_view rest = what; !rest.empty();) {
      const auto plus = rest.find('+');
      const std::string_view name = rest.substr(0, plus);
      if (name == "attention") b.attention = true;
      else if (name == "mlp_activation") b.mlp_activation = true;
      else if (name == "norms") b.norms = true;
      else throw Error("policy", fmt::format("recompute choice '{}': unknown part '{}'", whole_text, name));
      rest = plus == std::string_view::npos ? std::string_view{} : rest.substr(plus + 1);
    }
  }
  out.insert(out.end(), size_t(count), b);
}

}  // namespace

std::vector<BlockRecompute> blocks_from_string(std::string_view text, std::string_view whole_text) {
  std::vector<BlockRecompute> blocks;
  for (std::string_view rest = text; !rest.empty();) {
    const auto comma = rest.find(',');
    parse_block_run(rest.substr(0, comma), whole_text, blocks);
    rest = comma == std::string_view::npos ? std::string_view{} : rest.substr(comma + 1);
  }
  return blocks;
}

RecomputePolicy parse_recompute(std::string_view s) {
  RecomputePolicy r;
  const auto colon = s.find(':');
  const std::string_view head = s.substr(0, colon);
  const std::string_view tail = colon == std::string_view::npos ? std::string_view{} : s.substr(colon + 1);
  if (head == "none" && tail.empty()) return r;
  if (head == "full" && tail.empty()) {
    r.mode = RecomputeMode::full;
    return r;
  }
  if (head == "auto") {
    r.mode = RecomputeMode::automatic;
    if (!tail.empty()) r.blocks = blocks_from_string(tail, s);  // a resolved choice, as to_string writes it
    return r;
  }
  if (head == "every") {
    r.mode = RecomputeMode::every;
    if (tail == "sqrt") return r;  // every = 0: chosen from the layer count
    int k = 0;
    auto [p, ec] = std::from_chars(tail.data(), tail.data() + tail.size(), k);
    if (ec == std::errc() && p == tail.data() + tail.size() && k >= 1) {
      r.every = k;
      return r;
    }
  }
  if (head == "selective") {
    r.mode = RecomputeMode::selective;
    std::string_view rest = tail.empty() ? std::string_view("attention") : tail;
    while (!rest.empty()) {
      const auto comma = rest.find(',');
      r.ops.emplace_back(rest.substr(0, comma));
      rest = comma == std::string_view::npos ? std::string_view{} : rest.substr(comma + 1);
    }
    return r;
  }
  throw Error("policy",
              fmt::format("unknown recompute policy '{}' (expected none, full, every:K, every:sqrt, selective[:op,...] or auto)", s));
}

}  // namespace memfit
