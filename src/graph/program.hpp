// StepProgram: the tensors and ops of one training step, in execution order, grouped into
// sections of a SectionKind (each kind at most once). A step runs the micro section `repeat`
// times (gradient accumulation), then sync, then optimizer (runtime/executor.hpp's run_step is
// the one place that sequences them); eval runs on its own for validation. Persistent tensors
// (parameters, optimizer state) are shared by every section, so one memory plan covers them all.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "graph/op.hpp"
#include "graph/tensor.hpp"
#include "graph/tensor_parallel.hpp"

namespace memfit {

// The sections of a step, in the order a training program holds them.
enum class SectionKind : uint8_t {
  micro,      // load a batch, forward, loss, backward: run `repeat` times per step
  sync,       // data-parallel programs: the global loss and overflow flag, once per step
  optimizer,  // the update, once per step (skipped when fp16 gradients overflowed)
  eval,       // validation: a batch, forward, loss; never part of a step
  generate,   // prefill and decode over a KV cache (graph/inference_program.hpp); never part of a step
};
constexpr int kNumSectionKinds = 5;
std::string_view section_name(SectionKind kind);  // for output: "micro", "sync", ...

struct Section {
  SectionKind kind = SectionKind::micro;
  int begin = 0, end = 0;  // ops [begin, end)
  int repeat = 1;          // times the trainer runs it back to back per step
  // Times the section's ops run in one optimizer step: micro `repeat` times, sync and
  // optimizer once, eval never (validation runs apart from steps).
  int runs_per_step() const;
};

// How a parameter is stored: one or several persistent tensors, each with a role. A plain
// parameter is one `value` tensor; a quantised frozen weight is `codes` plus blockwise
// `scales` and, with double quantisation, `scales2` (the scales' own scales) and `offset`.
// Forward rewrites (graph/forward_rewrite.hpp) choose the storage; the forward reads the
// stored tensors through the ops the rewrite emits (e.g. a dequantise before a matmul).
enum class ParamRole : uint8_t { value, codes, scales, scales2, offset };
std::string_view param_role_name(ParamRole role);
struct StoredTensor {
  ParamRole role = ParamRole::value;
  TensorId id = kNoTensor;
};

// A trainable (or frozen) parameter and the tensors the optimizer keeps for it.
// Invariants (checked by Program::validate): `storage` lists every persistent tensor the
// parameter is stored as, and `value` is its value-role tensor (kNoTensor when the parameter
// is stored only in another form, e.g. quantised codes); a parameter without a value tensor
// is frozen. A frozen parameter has no gradient, no master and no optimizer state, and its
// tensors do not require gradients, so autodiff emits only the input-gradient path through it.
// normal: N(0, init_std); uniform: U(-init_std, init_std) (LoRA's A: PyTorch's
// kaiming_uniform_(a = sqrt(5)), whose bound is 1 / sqrt(fan_in)).
// row_norm: DoRA's magnitude, ||W + scale B A|| per row, set once the base weights are there
// (train/init.hpp initialize_dora_magnitudes); ones until then.
enum class ParamInit : uint8_t { normal, zeros, ones, uniform, row_norm };
struct ParamEntry {
  std::string name;  // HF-style name without the "transformer." prefix, e.g. "h.0.attn.c_attn.weight"
  TensorId value = kNoTensor;
  std::vector<StoredTensor> storage;  // {value} for a plain parameter
  TensorId grad = kNoTensor;
  TensorId master = kNoTensor;  // fp32 master copy under mixed precision
  std::vector<TensorId> state;  // optimizer state (AdamW: m, v)
  ParamInit init = ParamInit::normal;
  float init_std = 0.02f;
  bool decay = true;  // weight decay applies (matrices and embeddings; not biases or norms)
  bool trainable = true;  // false: frozen (see above)
  // ZeRO stage >= 1 (graph/zero.hpp): master and state hold only this rank's piece, elements
  // [shard_offset, shard_offset + shard_numel) of the parameter; -1: the whole parameter.
  int64_t shard_offset = 0;
  int64_t shard_numel = -1;
  // ZeRO stage 3: this rank's piece of the parameter itself (the persistent copy; `value` is
  // then a view into a transient gather buffer, valid only inside the step).
  TensorId value_shard = kNoTensor;
  // ZeRO stage 3 with a parameter stored as several tensors (quantised codes and scales): per
  // entry of `storage`, this rank's piece of that tensor's bytes, [first, first + bytes), as a
  // view into its persistent shard (view kNoTensor where it holds none). Empty otherwise.
  struct StoragePiece {
    TensorId view = kNoTensor;
    int64_t first = 0, bytes = 0;
  };
  std::vector<StoragePiece> storage_shard;
  // Tensor parallelism (graph/tensor_parallel.hpp): which elements of the one-rank parameter
  // this rank's value (and its master, gradient and optimizer state) holds; none: all of them.
  TensorSplit split;
  bool whole_state() const { return shard_numel < 0; }
  bool frozen() const { return !trainable; }
  // Stored as a single value tensor (what initialisation, loading and saving handle today).
  bool plain_storage() const { return storage.size() == 1 && storage[0].role == ParamRole::value; }
  TensorId stored(ParamRole role) const;  // kNoTensor when the parameter has no such tensor
};

class Program {
 public:
  TensorId add_tensor(TensorDesc desc);
  // A view of bytes [offset, offset + bytes(shape, dtype)) of `base` (resolved to its root).
  TensorId add_view(TensorId base, std::string name, Shape shape, DType dtype, uint64_t offset);
  int add_op(Op op);  // returns the op's index; sets the op's default queue (graph/op.hpp)

  void begin_section(SectionKind kind, int repeat = 1);
  void end_section();
  // For transformations that insert ops (graph/precision.cpp): replaces the op list;
  // section_of[i] is the index into sections() of ops[i], and each section's ops must be
  // contiguous and in section order. Op::replays indices are the caller's to remap.
  void replace_ops(std::vector<Op> ops, const std::vector<int>& section_of);
  // For forward rewrites (graph/forward_rewrite.hpp): removes and returns the last ops, from
  // `begin` on, all inside the open section, so that their replacements can be emitted.
  std::vector<Op> take_ops_from(int begin);

  const TensorDesc& tensor(TensorId id) const;
  TensorDesc& tensor(TensorId id);
  TensorId root_of(TensorId id) const;
  TensorId find_tensor(std::string_view name) const;  // kNoTensor when absent
  const std::vector<TensorDesc>& tensors() const { return tensors_; }
  const std::vector<Op>& ops() const { return ops_; }
  std::vector<Op>& ops() { return ops_; }
  const Op& op(int index) const { return ops_[size_t(index)]; }
  const std::vector<Section>& sections() const { return sections_; }
  const Section* find_section(SectionKind kind) const;  // null when the program has none
  int section_of_op(int op_index) const;  // -1 when outside every section

  std::vector<ParamEntry>& params() { return params_; }
  const std::vector<ParamEntry>& params() const { return params_; }
  const ParamEntry* find_param(std::string_view name) const;  // null when absent
  // Elements of all parameters (trainable and frozen), of the whole model: a tensor-parallel
  // rank counts each split parameter whole.
  int64_t parameter_count() const;
  int64_t trainable_parameter_count() const;  // elements this rank holds (a tensor-parallel slice as sliced)
  int64_t param_numel(const ParamEntry& e) const;  // elements of the parameter, however stored

  // Structural checks: parameter storage records consistent, tensor ids in range, one write
  // mode per output, views inside their root, sections disjoint, each kind at most once,
  // covering every op, every transient tensor written before it
  // is read. Throws [graph] with the first problem found.
  void validate() const;

 private:
  // Ops of the communicator and transfer engines go on their kind's default queue unless the
  // emitter chose one (graph/op.hpp).
  void assign_queue(Op& op) const;
  void validate_params() const;

  std::vector<TensorDesc> tensors_;
  std::vector<Op> ops_;
  std::vector<Section> sections_;
  std::vector<ParamEntry> params_;
  bool section_open_ = false;
};

}  // namespace memfit
