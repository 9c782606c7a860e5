// Reverse-mode differentiation of a recorded forward op range: walks the forward ops from
// last to first and emits, for each, the backward ops of its kind (the rules live in
// autodiff.cpp, one per op kind). Gradients of a tensor consumed several times are summed:
// the first contribution overwrites, later ones accumulate, so no gradient buffer is ever
// zero-filled. Parameter gradients either live only through one step (transient, created on
// first contribution) or are persistent accumulation buffers when gradient accumulation
// spans several micro-steps. Only tensors that require gradients receive them: a frozen
// parameter (graph/forward_rewrite.hpp) gets no weight-gradient product, and its op keeps
// only the input-gradient path.
#pragma once

#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "graph/builder.hpp"

namespace memfit {

class Autodiff {
 public:
  // persistent_param_grads: parameter gradients were created up front (ParamEntry::grad) and
  // are accumulated across micro-steps.
  Autodiff(GraphBuilder& builder, bool persistent_param_grads);

  // Where to write d(x) and how. Creates the gradient tensor on the first contribution.
  std::pair<TensorId, WriteMode> contribute(TensorId x);
  TensorId grad(TensorId x) const;  // kNoTensor when nothing flowed into x yet

  // Emits backward ops for the forward ops [begin, end) (phase backward).
  void backward(int begin, int end);

 private:
  void backward_of(const Op& fwd);
  void sum_grads_over_tensor_group(const Op& fwd);
  void pass_through(const std::string& name, TensorId x, TensorId dy);
  void collective_backward(const Op& fwd, TensorId dy);
  // contribute() without sequence parallelism's per-micro-step partial: the gradient itself.
  std::pair<TensorId, WriteMode> contribute_whole(TensorId x);
  void embedding_backward(const Op& fwd, TensorId dy);
  void sum_partial_param_grads();
  void matmul_backward(const Op& fwd, TensorId dy);
  void quant_linear_backward(const Op& fwd, TensorId dy);
  void add_backward(const Op& fwd, TensorId dy);
  void dora_scale_backward(const Op& fwd, TensorId dy);
  void dora_blend_backward(const Op& fwd, TensorId dy);

  GraphBuilder& b_;
  Program& p_;
  bool persistent_param_grads_;
  std::unordered_map<TensorId, TensorId> grads_;
  std::unordered_set<TensorId> written_;  // persistent parameter gradients written this micro-step
  std::unordered_map<TensorId, size_t> param_index_;  // parameter tensor -> index in Program::params()
  // Sequence parallelism: parameters' partial gradients of this micro-step (graph/tensor_parallel.hpp).
  std::unordered_map<TensorId, TensorId> partial_grads_;
  std::vector<TensorId> partial_order_;
};

}  // namespace memfit
