// A test-only forward rewrite, the skeleton LoRA (issue 17) builds on: every linear whose
// weight W matches a pattern gets a low-rank branch, y = x W^T + b + scale * (x A^T) B^T,
// with A [rank, in] (normal, std 0.02) and B [out, rank] (zeros, so the rewritten model
// starts as the original one), and W and its bias are frozen. A and B are named as PEFT
// names them ("h.0.attn.c_attn.lora_A.weight").
#pragma once

#include <map>
#include <string>
#include <vector>

#include "graph/forward_rewrite.hpp"

namespace memfit::test {

class LowRankBranch final : public ForwardRewrite {
 public:
  LowRankBranch(std::vector<std::string> patterns, int64_t rank, float scale)
      : patterns_(std::move(patterns)), rank_(rank), scale_(scale) {}
  std::string name() const override { return "low_rank_branch"; }
  void declare(GraphBuilder& b) override;
  bool rewrite(const Op& op, GraphBuilder& b) override;

  static std::string a_name(const std::string& weight);  // "x.weight" -> "x.lora_A.weight"
  static std::string b_name(const std::string& weight);

 private:
  struct Adapter {
    TensorId a = kNoTensor, b = kNoTensor;
  };
  std::vector<std::string> patterns_;
  int64_t rank_;
  float scale_;
  std::map<TensorId, Adapter> adapters_;  // by the frozen weight
};

}  // namespace memfit::test
