// HF's warpers, read off transformers' generation/logits_process.py: TopKLogitsWarper keeps
// every token whose logit is at least the k-th largest (ties at the boundary stay);
// TopPLogitsWarper sorts ascending, takes the cumulative softmax and drops the tokens whose
// cumulative probability is at most 1 - top_p, always keeping the most probable one. Both
// work on the temperature-scaled logits, in that order.
#include "train/sampling.hpp"

#include <algorithm>
#include <cmath>

#include "core/error.hpp"

namespace memfit {

void check_sampling_options(const SamplingOptions& o) {
  MEMFIT_CHECK(std::isfinite(o.temperature) && o.temperature >= 0, "cli", "--temperature must be at least 0, got {}",
               o.temperature);
  MEMFIT_CHECK(o.top_k >= 0, "cli", "--top-k must be at least 0 (0: off), got {}", o.top_k);
  MEMFIT_CHECK(o.top_p > 0 && o.top_p <= 1, "cli", "--top-p must be in (0, 1], got {}", o.top_p);
}

int32_t greedy_token(std::span<const float> logits) {
  MEMFIT_CHECK(!logits.empty(), "generate", "no logits to choose from");
  size_t best = 0;
  for (size_t i = 1; i < logits.size(); ++i)
    if (logits[i] > logits[best] || (std::isnan(logits[i]) && !std::isnan(logits[best]))) best = i;
  return int32_t(best);
}

Sampler::Sampler(const SamplingOptions& options, int64_t vocab)
    : options_(options), rng_(options.seed), order_(size_t(vocab)), weight_(size_t(vocab)) {
  check_sampling_options(options);
}

int32_t Sampler::next(std::span<const float> logits) {
  MEMFIT_CHECK(logits.size() == order_.size(), "generate", "{} logits for a vocabulary of {}", logits.size(),
               order_.size());
  if (options_.temperature == 0) return greedy_token(logits);
  const double inv_t = 1.0 / options_.temperature;
  for (size_t i = 0; i < order_.size(); ++i) order_[i] = int32_t(i);
  std::sort(order_.begin(), order_.end(), [&](int32_t a, int32_t b) {
    return logits[size_t(a)] != logits[size_t(b)] ? logits[size_t(a)] > logits[size_t(b)] : a < b;
  });
  size_t kept = order_.size();
  if (options_.top_k > 0 && size_t(options_.top_k) < kept) {
    const float kth = logits[size_t(order_[size_t(options_.top_k) - 1])];
    kept = size_t(options_.top_k);
    while (kept < order_.size() && logits[size_t(order_[kept])] >= kth) ++kept;
  }
  // Softmax over the kept tokens of logits / temperature (max first, so exp cannot overflow).
  const double top = double(logits[size_t(order_[0])]) * inv_t;
  double sum = 0;
  for (size_t i = 0; i < kept; ++i) sum += (weight_[i] = std::exp(double(logits[size_t(order_[i])]) * inv_t - top));
  if (options_.top_p < 1.0) {
    // Ascending cumulative probability: drop the least probable while it stays <= 1 - top_p.
    double cum = 0;
    size_t drop = 0;
    for (size_t i = kept; i-- > 1;) {
      cum += weight_[i] / sum;
      if (cum > 1.0 - options_.top_p) break;
      ++drop;
    }
    kept -= drop;
    sum = 0;
    for (size_t i = 0; i < kept; ++i) sum += weight_[i];
  }
  const double u = double(rng_() >> 11) * 0x1.0p-53 * sum;
  double acc = 0;
  for (size_t i = 0; i < kept; ++i)
    if ((acc += weight_[i]) > u) return order_[i];
  return order_[kept - 1];
}

}  // namespace memfit
