#include "graph/op.hpp"

#include "core/error.hpp"

namespace memfit {

std::string_view phase_name(Phase p) {
  switch (p) {
    case Phase::forward: return "forward";
    case Phase::backward: return "backward";
    case Phase::recompute: return "recompute";
    case Phase::optimizer: return "optimizer";
    case Phase::communication: return "communication";
    case Phase::transfer: return "transfer";
  }
  MEMFIT_ASSERT(false, "unknown phase {}", int(p));
}

std::string_view op_kind_name(OpKind k) {
  switch (k) {
#define MEMFIT_KIND(x) \
  case OpKind::x: return #x;
    MEMFIT_KIND(load_input)
    MEMFIT_KIND(embedding_forward)
    MEMFIT_KIND(embedding_backward)
    MEMFIT_KIND(layernorm_forward)
    MEMFIT_KIND(layernorm_backward)
    MEMFIT_KIND(rmsnorm_forward)
    MEMFIT_KIND(rmsnorm_backward)
    MEMFIT_KIND(matmul)
    MEMFIT_KIND(bias_grad)
    MEMFIT_KIND(gelu_forward)
    MEMFIT_KIND(gelu_backward)
    MEMFIT_KIND(swiglu_forward)
    MEMFIT_KIND(swiglu_backward)
    MEMFIT_KIND(rope_forward)
    MEMFIT_KIND(rope_backward)
    MEMFIT_KIND(attention_forward)
    MEMFIT_KIND(attention_backward)
    MEMFIT_KIND(flash_attention_forward)
    MEMFIT_KIND(flash_attention_backward)
    MEMFIT_KIND(add)
    MEMFIT_KIND(add_columns)
    MEMFIT_KIND(slice_columns)
    MEMFIT_KIND(dora_norm)
    MEMFIT_KIND(dora_scale)
    MEMFIT_KIND(dora_scale_backward)
    MEMFIT_KIND(dora_blend)
    MEMFIT_KIND(dora_blend_backward)
    MEMFIT_KIND(dropout_forward)
    MEMFIT_KIND(dropout_backward)
    MEMFIT_KIND(accumulate)
    MEMFIT_KIND(classifier)
    MEMFIT_KIND(classifier_eval)
    MEMFIT_KIND(loss_mean)
    MEMFIT_KIND(cast)
    MEMFIT_KIND(quantize)
    MEMFIT_KIND(dequantize)
    MEMFIT_KIND(quant_linear)
    MEMFIT_KIND(quant_linear_backward)
    MEMFIT_KIND(check_finite)
    MEMFIT_KIND(embedding_at)
    MEMFIT_KIND(cached_attention)
    MEMFIT_KIND(fill)
    MEMFIT_KIND(grad_norm)
    MEMFIT_KIND(adamw)
    MEMFIT_KIND(adamw8bit)
    MEMFIT_KIND(all_reduce)
    MEMFIT_KIND(reduce_scatter)
    MEMFIT_KIND(all_gather)
    MEMFIT_KIND(broadcast)
    MEMFIT_KIND(transfer)
    MEMFIT_KIND(comm_quantize)
    MEMFIT_KIND(comm_dequantize)
    MEMFIT_KIND(wait)
    MEMFIT_KIND(all_to_all)
    MEMFIT_KIND(grad_quantize)
    MEMFIT_KIND(grad_dequantize_sum)
    MEMFIT_KIND(add_bias)
    MEMFIT_KIND(classifier_partial)
    MEMFIT_KIND(classifier_combine)
    MEMFIT_KIND(classifier_parallel_backward)
#undef MEMFIT_KIND
  }
  MEMFIT_ASSERT(false, "unknown op kind {}", int(k));
}

bool is_collective_kind(OpKind k) {
  return k == OpKind::all_reduce || k == OpKind::reduce_scatter || k == OpKind::all_gather || k == OpKind::broadcast ||
         k == OpKind::all_to_all;
}

std::string_view engine_name(Engine e) {
  switch (e) {
    case Engine::compute: return "compute";
    case Engine::communicator: return "communicator";
    case Engine::transfer: return "transfer";
  }
  MEMFIT_ASSERT(false, "unknown engine {}", int(e));
}

std::string_view queue_name(Queue q) {
  switch (q) {
    case Queue::compute: return "compute";
    case Queue::comm_reduce: return "comm.reduce";
    case Queue::comm_gather: return "comm.gather";
    case Queue::transfer_out: return "transfer.out";
    case Queue::transfer_in: return "transfer.in";
  }
  MEMFIT_ASSERT(false, "unknown queue {}", int(q));
}

Engine queue_engine(Queue q) {
  switch (q) {
    case Queue::compute: return Engine::compute;
    case Queue::comm_reduce:
    case Queue::comm_gather: return Engine::communicator;
    case Queue::transfer_out:
    case Queue::transfer_in: return Engine::transfer;
  }
  MEMFIT_ASSERT(false, "unknown queue {}", int(q));
}

// Transfers use no library scratch, and optimizer offload starts several per chunk (master, m,
// v, 8-bit absmax) that must all be in flight while the previous chunk is updated.
int queue_depth(Queue q) { return queue_engine(q) == Engine::transfer ? kTransferQueueDepth : 1; }

std::string_view comm_group_name(CommGroup g) {
  switch (g) {
    case CommGroup::world: return "world";
    case CommGroup::data: return "data";
    case CommGroup::tensor: return "tensor";
    case CommGroup::node: return "node";
    case CommGroup::across_nodes: return "across_nodes";
    case CommGroup::hpz: return "hpz";
  }
  MEMFIT_ASSERT(false, "unknown group {}", int(g));
}

Queue default_queue(OpKind kind, bool outward) {
  switch (kind) {
    case OpKind::all_reduce:
    case OpKind::reduce_scatter:
    case OpKind::all_to_all: return Queue::comm_reduce;
    case OpKind::all_gather:
    case OpKind::broadcast: return Queue::comm_gather;
    case OpKind::transfer: return outward ? Queue::transfer_out : Queue::transfer_in;
    default: return Queue::compute;
  }
}

bool write_mode_reads(WriteMode m) { return m != WriteMode::overwrite; }

}  // namespace memfit
