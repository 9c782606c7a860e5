// Choosing the next token from a row of logits, as transformers' generate does: greedy argmax
// (the lowest index on ties, as torch.argmax), or sampling after HF's warpers in HF's order:
// temperature, top-k, top-p, then softmax and one draw. Draws come from memfit's own seeded
// generator, so the same seed gives the same tokens (not torch.multinomial's: sampled tokens
// are reproducible across memfit runs, not equal to PyTorch's).
// Invariant: every buffer is allocated at construction; next() allocates nothing.
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <vector>

namespace memfit {

struct SamplingOptions {
  double temperature = 0;  // 0: greedy; > 0: sample
  int64_t top_k = 0;       // 0: off
  double top_p = 1.0;      // in (0, 1]; 1: off
  uint64_t seed = 0;
};

// Throws [cli] for a negative temperature or top-k, or a top-p outside (0, 1].
void check_sampling_options(const SamplingOptions& options);

// argmax of logits, the lowest index on ties.
int32_t greedy_token(std::span<const float> logits);

class Sampler {
 public:
  Sampler(const SamplingOptions& options, int64_t vocab);
  // The next token from the logits of the real vocabulary (logits.size() == vocab).
  int32_t next(std::span<const float> logits);

 private:
  SamplingOptions options_;
  std::mt19937_64 rng_;
  std::vector<int32_t> order_;  // token ids, highest logit first
  std::vector<double> weight_;  // exp of the scaled logits of the kept tokens, in order_'s order
};

}  // namespace memfit
