// GraphBuilder: the vocabulary model builders use to emit a step program. It names tensors,
// counts FLOPs per op, tags ops with the current layer and phase, and marks forward outputs
// as requiring gradients when any input does (so autodiff knows where gradients flow).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "graph/policy.hpp"
#include "graph/program.hpp"
#include "graph/tensor_parallel.hpp"

namespace memfit {

class GraphBuilder {
 public:
  explicit GraphBuilder(Program& program) : p_(program) {}
  Program& program() { return p_; }

  void set_layer(int layer) { layer_ = layer; }
  int layer() const { return layer_; }
  void set_phase(Phase phase) { phase_ = phase; }
  Phase phase() const { return phase_; }
  // Off while emitting forward passes that are never differentiated (validation).
  void set_grad_enabled(bool on) { grad_enabled_ = on; }
  bool grad_enabled() const { return grad_enabled_; }
  // The tensor-parallel slice the builders emit (graph/tensor_parallel.hpp); one rank by default.
  void set_tensor_parallel(TensorParallel tp) { tp_ = tp; }
  const TensorParallel& tensor_parallel() const { return tp_; }

  // A persistent, trainable parameter (registered in program().params()). `shape` is the
  // one-rank shape; with a split, this rank's tensor has the split's local shape.
  TensorId parameter(std::string name, Shape shape, ParamInit init, float init_std, bool decay,
                     TensorSplit split = {});
  TensorId persistent(std::string name, Shape shape, Category category, DType dtype = DType::f32);
  TensorId transient(std::string name, Shape shape, Category category, DType dtype = DType::f32);

  struct OpSpec {
    OpKind kind;
    std::string name;
    std::vector<TensorId> inputs;
    std::vector<TensorId> outputs;
    OpAttrs attrs = NoAttrs{};
    double flops = 0;
    std::vector<WriteMode> modes = {};
    std::vector<TensorId> workspace = {};
    std::vector<std::pair<int, int>> inplace = {};
    double comm_bytes = 0;  // collectives: bytes sent per rank
  };
  int emit(OpSpec spec);  // returns the op index

  // --- forward ops (activations are transient fp32 of category activations) ---
  // Under tensor parallelism wte is this rank's vocabulary slice: each rank looks up the tokens
  // in its slice (rank 0 adds the positions) and the tensor group's all_reduce sums them.
  TensorId embedding(const std::string& name, TensorId tokens, TensorId wte, TensorId wpe);
  struct NormOut {
    TensorId y, mean, rstd;
  };
  NormOut layernorm(const std::string& name, TensorId x, TensorId w, TensorId b, float eps);
  // y (N, out) = x (N, in) @ w^T + b, with w stored [out, in] (nn.Linear layout).
  TensorId linear(const std::string& name, TensorId x, TensorId w, TensorId b);
  // Tensor parallelism: a row-parallel product (w holds a slice of the input columns): the
  // partial products are summed over the tensor group, then the bias is added once; `linear`
  // on one rank.
  TensorId row_parallel_linear(const std::string& name, TensorId x, TensorId w, TensorId b);
  // Marks x, the replicated input of column-parallel products, so that autodiff sums its
  // gradient over the tensor group (nothing on one rank).
  void sum_grad_over_tensor_group(TensorId x);
  // The input of column-parallel products from x: x itself, its gradient summed over the tensor
  // group; under sequence parallelism the full rows (shape `full`) gathered from x's row shard.
  TensorId column_parallel_input(const std::string& name, TensorId x, const Shape& full);
  // Sequence parallelism: this rank's rows of the group's sum of `full` (reduce_scatter), and
  // the full tensor gathered from each rank's rows (all_gather).
  TensorId scatter_rows(const std::string& name, TensorId full);
  TensorId gather_rows(const std::string& name, TensorId shard, const Shape& full);
  // y = the sum over the tensor group of x (a new tensor; the gradient passes through).
  TensorId tensor_all_reduce(const std::string& name, TensorId x);
  TensorId add_bias(const std::string& name, TensorId x, TensorId b);
  // The vocabulary-parallel cross-entropy's forward (graph/training_program.cpp): each rank's
  // row statistics over its vocabulary slice w, gathered over the tensor group and combined
  // into the per-row losses (N) and log-sum-exp (N), both fp32. `c` is the classifier's.
  struct ParallelLosses {
    TensorId losses = kNoTensor, lse = kNoTensor;
  };
  ParallelLosses vocab_parallel_losses(const std::string& prefix, TensorId hidden, TensorId w, TensorId targets,
                                       const ClassifierAttrs& c);
  TensorId gelu(const std::string& name, TensorId x);
  TensorId add(const std::string& name, TensorId a, TensorId b);
  // The plain form keeps probs (B, NH, T, T) for backward; flash keeps lse (B, NH, T) fp32.
  struct AttentionOut {
    TensorId y = kNoTensor, probs = kNoTensor, lse = kNoTensor;
  };
  AttentionOut attention(const std::string& name, TensorId qkv, const AttentionAttrs& attrs,
                         AttentionKind kind = AttentionKind::plain);
  // LLaMA vocabulary (graph/builder_llama.cpp). The token
  // embedding without a position table (inputs [tokens, wte]); RMSNorm; rotary embedding of
  // the q and k heads of a qkv tensor (y may take x's bytes); SwiGLU y = silu(gate) * up.
  TensorId token_embedding(const std::string& name, TensorId tokens, TensorId wte);
  NormOut rmsnorm(const std::string& name, TensorId x, TensorId w, float eps);
  TensorId rope(const std::string& name, TensorId qkv, const AttentionAttrs& attrs);
  TensorId swiglu(const std::string& name, TensorId gate, TensorId up);

 private:
  TensorId activation_like(const std::string& name, Shape shape, std::initializer_list<TensorId> inputs);

  Program& p_;
  int layer_ = -1;
  Phase phase_ = Phase::forward;
  bool grad_enabled_ = true;
  TensorParallel tp_;
};

}  // namespace memfit
