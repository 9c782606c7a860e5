// The op contract of the classifier kinds (see op_contract.hpp): the fused classifier and
// classifier_eval, and tensor parallelism's vocabulary-parallel classifier.
#include <algorithm>

#include "kernels/op_contract.hpp"

namespace memfit {

namespace {

// The fp32 logits chunk (workspace 0) holds a chunk of rows over the weight's `vocab_rows`.
void check_logits_chunk(const Program& p, const Op& op, const ClassifierAttrs& a, int64_t vocab_rows) {
  require_dtype(p, op, op.workspace[0], DType::f32);
  const int64_t chunk_numel = std::min(a.chunk_rows, a.rows) * vocab_rows;
  MEMFIT_CHECK(p.tensor(op.workspace[0]).numel() >= chunk_numel, "kernels",
               "op '{}': the logits chunk '{}' has {} elements, fewer than {}", op.name, p.tensor(op.workspace[0]).name,
               p.tensor(op.workspace[0]).numel(), chunk_numel);
}

}  // namespace

void check_classifier(const Program& p, const Op& op) {
  const bool train = op.kind == OpKind::classifier;
  check_arity(op, 3, train ? 3 : 1, 1);
  const ClassifierAttrs& a = attrs_of<ClassifierAttrs>(op);
  const TensorDesc& wte = p.tensor(op.inputs[1]);
  const int64_t C = wte.shape.last(), Vp = wte.shape.rows();
  require_dtype(p, op, op.inputs[0], wte.dtype);
  if (train) require_dtype(p, op, op.outputs[1], wte.dtype);
  require_dtype(p, op, op.outputs[0], DType::f32);
  check_numel(p, op, op.inputs[0], a.rows * C, "x");
  check_numel(p, op, op.inputs[2], a.rows, "targets");
  check_numel(p, op, op.outputs[0], a.rows, "losses");
  if (train) {
    check_numel(p, op, op.outputs[1], a.rows * C, "dx");
    check_numel(p, op, op.outputs[2], Vp * C, "dwte");
  }
  require_overwrite(op, 0);
  check_logits_chunk(p, op, a, Vp);
}

// The vocabulary-parallel classifier (graph/op.hpp): x and w (Vs, C) share a dtype, as do dx and
// x; dw has its own (the gradient dtype); stats, lse and losses are fp32. A slice may begin past
// the real vocabulary (all its columns padding).
void check_classifier_parallel(const Program& p, const Op& op) {
  const ClassifierAttrs& a = attrs_of<ClassifierAttrs>(op);
  if (op.kind == OpKind::classifier_combine) {
    check_arity(op, 1, 2);
    MEMFIT_CHECK(a.parts >= 1 && a.rows > 0, "kernels", "op '{}': {} parts of {} rows", op.name, a.parts, a.rows);
    check_numel(p, op, op.inputs[0], int64_t(a.parts) * a.rows * 3, "stats");
    check_numel(p, op, op.outputs[0], a.rows, "losses");
    check_numel(p, op, op.outputs[1], a.rows, "lse");
    for (TensorId id : {op.inputs[0], op.outputs[0], op.outputs[1]}) require_dtype(p, op, id, DType::f32);
    require_overwrite(op, 0);
    require_overwrite(op, 1);
    return;
  }
  const bool partial = op.kind == OpKind::classifier_partial;
  check_arity(op, partial ? 3 : 4, partial ? 1 : 2, 1);
  const TensorDesc& w = p.tensor(op.inputs[1]);
  const int64_t C = w.shape.last(), Vs = w.shape.rows();
  MEMFIT_CHECK(a.rows > 0 && a.vocab > 0 && a.chunk_rows > 0 && a.vocab_begin >= 0, "kernels",
               "op '{}': rows={} vocab={} chunk_rows={} vocab_begin={}", op.name, a.rows, a.vocab, a.chunk_rows,
               a.vocab_begin);
  require_dtype(p, op, op.inputs[0], w.dtype);
  check_numel(p, op, op.inputs[0], a.rows * C, "x");
  check_numel(p, op, op.inputs[2], a.rows, "targets");
  if (partial) {
    check_numel(p, op, op.outputs[0], a.rows * 3, "stats");
    require_dtype(p, op, op.outputs[0], DType::f32);
    require_overwrite(op, 0);
  } else {
    check_numel(p, op, op.inputs[3], a.rows, "lse");
    require_dtype(p, op, op.inputs[3], DType::f32);
    check_numel(p, op, op.outputs[0], a.rows * C, "dx");
    require_dtype(p, op, op.outputs[0], w.dtype);
    check_numel(p, op, op.outputs[1], Vs * C, "dw");
  }
  check_logits_chunk(p, op, a, Vs);
}

}  // namespace memfit
