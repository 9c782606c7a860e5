// The op contract: what every backend checks before it prepares an op, whatever its kernels.
// graph/op.hpp states the tensor conventions of each kind; check_op_contract() enforces the
// part of them that is backend-neutral: the number of inputs, outputs and workspace tensors,
// the element count of each against the attributes and the other tensors, which slots are
// integers (tokens, targets, 8-bit codes), which are fp32 whatever the policy (statistics,
// losses, flags, float workspace), which must share a dtype, and which outputs can only be
// overwritten. A backend's own prepare keeps only what is its own: which dtype combinations it
// has kernels for, its library scratch, its kernel objects.
//
// Invariant: an op that passes the contract cannot make a conforming kernel read or write
// outside its tensors; every refusal is an Error of piece [kernels] naming the op.
#pragma once

#include <cstdint>
#include <string_view>
#include <variant>

#include "core/error.hpp"
#include "graph/capabilities.hpp"
#include "graph/program.hpp"
#include "kernels/backend.hpp"

namespace memfit {

// The backend-neutral checks of `op` (see above). Ops that write nothing (every output absent,
// except fill) are only checked for their dtypes: backends run them as no-ops.
void check_op_contract(const Program& program, const Op& op);
// The binding holds one address per tensor of the op (throws [kernels] otherwise).
void check_binding(const Op& op, const OpBinding& binding);
// Every output is absent and the op is not a fill: a backend makes it a no-op.
bool writes_nothing(const Op& op);
// The dtype a backend's capability table is asked about for `op`: its first float output's, else
// its first float input's (fp32 when it has neither).
DType op_storage_dtype(const Program& program, const Op& op);
// Throws "[kernels] no <backend> kernel for <kind> (<dtype>)" unless `caps` supports the op's
// storage dtype.
void require_capability(const OpCapabilities& caps, const Program& program, const Op& op);

// --- pieces of the contract, for backends' own checks ---

[[noreturn]] void no_kernel(std::string_view backend, const Op& op, DType dtype);
void check_arity(const Op& op, size_t inputs, size_t outputs, size_t workspace = 0);
// Tensor `id` (when present) has `numel` elements.
void check_numel(const Program& program, const Op& op, TensorId id, int64_t numel, const char* what);
// Tensor `id` (when present) has dtype `want`.
void require_dtype(const Program& program, const Op& op, TensorId id, DType want);
// Output j is written in overwrite mode (saved statistics, probabilities).
void require_overwrite(const Op& op, size_t j);
// The classifier kinds' checks (kernels/op_contract_classifier.cpp): classifier and
// classifier_eval; classifier_partial, classifier_combine and classifier_parallel_backward.
void check_classifier(const Program& p, const Op& op);
void check_classifier_parallel(const Program& p, const Op& op);
void check_dora(const Program& p, const Op& op);  // op_contract_dora.cpp
inline DType dtype_of(const Program& p, TensorId id) { return id == kNoTensor ? DType::f32 : p.tensor(id).dtype; }

template <class A>
const A& attrs_of(const Op& op) {
  const A* a = std::get_if<A>(&op.attrs);
  MEMFIT_CHECK(a, "kernels", "op '{}' ({}) lacks its attributes", op.name, op_kind_name(op.kind));
  return *a;
}

// embedding_forward / embedding_backward carry NoAttrs (one rank: every token must index the
// table) or EmbeddingAttrs (a tensor-parallel rank's slice of the vocabulary: the table's row r is
// token vocab_begin + r, and tokens outside the slice belong to another rank and are skipped).
struct EmbeddingSlice {
  int64_t vocab_begin = 0;
  bool add_positions = true;  // forward: add wpe (when the op has it)
  bool sliced = false;        // EmbeddingAttrs: tokens outside the table's rows are skipped, not an error
};
EmbeddingSlice embedding_slice(const Op& op);

// The update ops' inputs are [grads (n), (norm)], the norm there when clipping is on; their
// outputs are `roles` groups of n. Returns n.
size_t update_op_tensors(const Op& op, const AdamWAttrs& a, size_t roles);

}  // namespace memfit
