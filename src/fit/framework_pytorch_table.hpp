// The expressions behind fit/framework_pytorch.hpp, written by tools/derive_pytorch_memory_model.py.
//
// That tool records the signed allocation sizes of one HF training step under torch's profiler
// for a model of 1, 2 and 3 layers whose shapes make every size a distinct product of shapes
// (N x C x 4 bytes, B x H x T x T x 1 byte, ...), names each size by that product, and finds
// the block of allocations one more layer adds. The live bytes after any allocation are then a
// sum of such products with coefficients `once + per_extra_layer x (L - 1)`: exactly the
// allocator's count for any shapes that take the same code path. Of the hundreds of
// allocations, those that are the largest for some realistic shapes are kept (the others
// never are, up to 0.05%). The sequence depends on the code path, so each variant is traced
// on its own: attention, checkpointing, autocast, and batch 1 (torch's matmul folds a batch
// of one into a plain product and keeps other copies), and for Llama whether K/V heads are
// repeated (GQA; one K/V head at batch 1 is repeated by a view) and whether the embeddings are tied.
#pragma once

#include <cstdint>
#include <vector>

namespace memfit::torch_model {

// Products of the shapes (N = B x T tokens, D = C / heads, KV = key/value heads, NP = positions).
enum Mono : uint8_t {
  NC, NI, BHTT, NV, VC, N, BHT, TD, NKVD, BTT, TT, CC, CI, NPC, CKVD, KVD,
  C, I, V, T, D, TC, NH, BKVTT, HTT, B, One, kMonos
};

// Parameter-shaped products: in the backward, gradients; in the forward, autocast's weight copies.
inline bool parameter_shaped(Mono m) {
  return m == CC || m == CI || m == VC || m == NPC || m == CKVD || m == KVD || m == C || m == I || m == V;
}

struct Term {
  Mono mono;
  int32_t once, per_extra_layer;  // bytes per unit of the product: once + per_extra_layer x (L - 1)
};

// Variant key: which code path the step takes.
// gqa: fewer K/V heads than heads, repeated by copies; mqa: one K/V head at batch 1, whose
// repetition is a view.
struct Variant {
  bool llama = false, eager = false, checkpointing = false, bf16 = false, batch1 = false, gqa = false, mqa = false;
  bool tied = false;
  bool operator==(const Variant&) const = default;
};

enum class Phase : uint8_t { saved, forward, backward };  // saved: the live bytes the forward leaves

struct Entry {
  Variant variant;
  Phase phase;
  const char* where;  // the allocation: P<i> before the layers, X<first|last><i> in the first or
                      // last layer's block, S<i> after them
  bool two_layers;    // an X entry: the block exists in models of at least 2 layers
  std::vector<Term> terms;
};

const std::vector<Entry>& gpt2_entries();
const std::vector<Entry>& llama_entries();

}  // namespace memfit::torch_model
