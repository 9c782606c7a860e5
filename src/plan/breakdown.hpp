// What occupies a tier while one op runs (usually the peak op): every live buffer with the
// tensor holding it, largest first, and the same bytes summed per transformer layer. Used by
// the out-of-memory report, `memfit profile` and `memfit max-batch`. The entries add up to
// TierPlan::live_bytes at that op exactly (plan/buffers.hpp explains in-place chains).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "plan/buffers.hpp"

namespace memfit {

struct LiveTensor {
  TensorId tensor = kNoTensor;  // the root holding the buffer at the op
  uint64_t bytes = 0;           // the buffer's bytes
  Category category = Category::activations;
  int layer = -1;
  bool persistent = false;
  int born = -1, dies = -1;     // the holder's interval (op indices)
};

// Buffers of `tier` live at `op`, largest first (ties by tensor id).
std::vector<LiveTensor> live_tensors_at(const Program& program, const MemoryPlan& plan,
                                        const std::vector<PlannedBuffer>& buffers, Tier tier, int op);

struct LayerBytes {
  int layer = -1;  // -1: outside the transformer blocks (embeddings, final norm, classifier, optimizer)
  CategoryBytes by_category{};
  uint64_t total = 0;
};
// Sums per layer, in layer order (-1 first); layers holding nothing are left out.
std::vector<LayerBytes> bytes_by_layer(const std::vector<LiveTensor>& live);

// "h.3.attn.core.probs (activations, layer 3, made by op 'h.3.attn.core', last used by 'h.3.attn.core.bwd')"
std::string describe_live_tensor(const Program& program, const LiveTensor& t);

}  // namespace memfit
