// The allocation order behind fit/pytorch_allocation_order.hpp, written by
// tools/derive_pytorch_allocation_order.py (framework_pytorch_order_{gpt2,llama}.cpp).
//
// That tool records one HF training step on the CPU under torch's profiler with the CUDA rules of
// tools/cuda_allocation_rules.py applied (what a CUDA run allocates that a CPU run does not, and
// the reverse), for models of 1-4 layers whose products of shapes are distinct, and keeps the
// forward's and the backward's allocations in order. Each phase is P + X^(L-1) + S: X is what
// one more layer adds. Each allocation has a size (a product of shapes, or a formula: OrderKind),
// flags for the allocations the C++ side adds to, and a death: the allocation after which it is
// freed (the allocator's state after a run of frees does not depend on their order).
//
// An architecture's allocations are a table of distinct `size,flags,death` texts, space-separated
// (size: an index into its OrderExpr table); a phase's text is `P|X|S`, each allocation two
// characters, its index in the table as two digits of base 89 (order_code_digit). A death is E
// (freed with the step's last frees,
// after the optimizer's allocations) or the allocation after which it is freed, as a place in
// the forward (f) or backward (b) laid out as P X X ... S: index len(P) + len(X) x copy + pos,
// where copy is, for the dying allocation's own copy c of X (0 outside X) and L layers,
// s: c + k, o: (L - 2) - c + k, a: k, e: (L - 2) + k; `bo-1.7` is backward, copy (L - 2) - c - 1,
// pos 7. The relation holds for copies 0..L-2 (`^lh`: l..L-2-h); below (`<`) or above (`>`)
// them the death is the same index, inside P or S, unless the text names a place: `<E`, `>fS2`
// (the forward's S[2]), `>bP7`. `/E`, `/b13`: in a model of one layer (both the first and the
// last) it is freed there instead (b13: the backward's allocation 13).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "fit/framework_pytorch_table.hpp"

namespace memfit {
struct ModelSpec;
struct TorchStep;
}  // namespace memfit

namespace memfit::torch_model {

// The code path a step takes (fit/framework_pytorch.cpp): which table and order apply.
Variant variant_of(const ModelSpec& s, const TorchStep& st);

// Sizes that are no product of shapes (H heads, D head size, T sequence, B batch):
// lse32: the memory-efficient kernel's log-sum-exp, B x H x roundup(T, 32) floats;
// effws: its backward's workspace, B x H x roundup(T, 128) x D x 4 + B x H x T / 4 bytes;
// cudnnws / cudnnws_gqa: cuDNN attention's backward workspace,
//   (1 or 2) x B x T x H x D x 4 + B x H x T x 4 + 256 bytes (2 with grouped K/V heads).
enum class OrderKind : uint8_t { product, lse32, effws, cudnnws, cudnnws_gqa };

struct OrderTerm {
  Mono mono;
  int32_t bytes;  // per unit of the product
};

struct OrderExpr {
  OrderKind kind;
  std::vector<OrderTerm> terms;  // kind product: the sum of the terms
};

// Flags: what the CUDA run allocates around this allocation (fit/pytorch_allocation_order.cpp).
enum OrderFlag : uint32_t {
  kGemmOutput = 1,       // a product's output: the thread's first cuBLAS call allocates its workspace
  kAddmmOutput = 2,      // ... through cuBLASLt (addmm with a bias): 1 MiB more on its first call
  kSumRowsFloat = 4,     // a sum over the N rows of an N x F float gradient (F = bytes / 4): the
  kSumRowsHalf = 8,      // reduction's staging buffer and semaphores; Half: 2-byte elements
  kSoftmaxBackward = 16, // softmax's backward: a second buffer of its size
  kEmbeddingGrad = 32,   // embedding's gradient over the B x T tokens: past 3072 indices, the sort's buffers
  kEmbeddingPositionsGrad = 64,  // ... over the T positions (GPT-2's wpe)
};

struct OrderVariant {
  Variant variant;
  const char* forward;
  const char* backward;
};

// The digits of an allocation's code: printable ASCII from '#' but '?' (trigraphs), '\\' and '|'.
inline constexpr int kOrderCodeBase = 89;
inline int order_code_digit(char c) {
  int d = c - '#';
  if (c > '?') --d;
  if (c > '\\') --d;
  if (c > '|') --d;
  return d;
}

std::span<const OrderExpr> gpt2_order_exprs();
const char* gpt2_order_items();
std::span<const OrderVariant> gpt2_order_variants();
std::span<const OrderExpr> llama_order_exprs();
const char* llama_order_items();
std::span<const OrderVariant> llama_order_variants();

}  // namespace memfit::torch_model
