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
    MEMFIT_KIND(accumulate)
    MEMFIT_KIND(classifier)
    MEMFIT_KIND(classifier_eval)
    MEMFIT_KIND(loss_mean)
    MEMFIT_KIND(cast)
    MEMFIT_KIND(quantize)
    MEMFIT_KIND(dequantize)
    MEMFIT_KIND(check_finite)
    MEMFIT_KIND(fill)
    MEMFIT_KIND(grad_norm)
    MEMFIT_KIND(adamw)
    MEMFIT_KIND(adamw8bit)
    MEMFIT_KIND(all_reduce)
    MEMFIT_KIND(reduce_scatter)
    MEMFIT_KIND(all_gather)
    MEMFIT_KIND(broadcast)
    MEMFIT_KIND(collective_wait)
    MEMFIT_KIND(transfer)
#undef MEMFIT_KIND
  }
  MEMFIT_ASSERT(false, "unknown op kind {}", int(k));
}

bool is_collective_kind(OpKind k) {
  return k == OpKind::all_reduce || k == OpKind::reduce_scatter || k == OpKind::all_gather || k == OpKind::broadcast;
}

bool write_mode_reads(WriteMode m) { return m != WriteMode::overwrite; }

}  // namespace memfit
