#include "graph/policy.hpp"

#include <charconv>

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
  if (head == "auto" && tail.empty()) {
    r.mode = RecomputeMode::automatic;
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
