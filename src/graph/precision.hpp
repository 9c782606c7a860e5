// Mixed precision (bf16, fp16) as a transformation of the step program. Three hooks of
// build_training_program:
//   declare_master_weights  parameters become 16-bit; each trainable one gets an fp32 master
//                           (ParamEntry::master, category master_weights) that the optimizer
//                           updates and a cast op copies back into the parameter;
//   emit_overflow_check     fp16 only: a check_finite op over every parameter gradient at the
//                           end of the micro section, into the persistent flag kOverflowFlag
//                           that the trainer reads before it runs (or skips) the optimizer;
//   apply_precision         after everything is emitted: every float tensor gets its dtype
//                           (16-bit activations, parameter gradients in policy.grad_dtype,
//                           fp32 where op.hpp says "fp32 always"), and every op that must
//                           compute in fp32 becomes an *fp32 island*: cast ops widen its
//                           16-bit inputs into fp32 temporaries before it, and narrow its
//                           outputs (with the output's write mode) after it.
// An op computes in fp32 when the policy pins it (Policy::fp32_ops) or when the backend that
// will run the program has no kernel for its kind in the compute dtype (its OpCapabilities,
// graph/capabilities.hpp). The CPU backend, for one: oneDNN 2.6 has bf16 matmuls but no fp16
// ones, so under fp16 on the CPU every product (matmul, attention, classifier) is an island,
// where a GPU preset of `memfit plan` runs them natively.
//
// Subtle point: islands change no tensor's dtype. A pinned op's outputs are still stored in
// 16 bits; what the pin buys is fp32 arithmetic inside the op, and the plan counts the fp32
// temporaries it costs.
#pragma once

#include "graph/builder.hpp"
#include "graph/capabilities.hpp"
#include "graph/policy.hpp"

namespace memfit {

inline constexpr const char* kOverflowFlag = "overflow_flag";

// bf16 or f16 for a 16-bit policy, f32 for fp32.
DType compute_dtype(Precision p);

// Throws [policy] for combinations the precision pass cannot express (a gradient dtype that
// is neither fp32 nor the compute dtype, fp32_ops without a 16-bit precision).
void check_precision_policy(const Policy& policy);

void declare_master_weights(GraphBuilder& b, const Policy& policy);
void emit_overflow_check(GraphBuilder& b, const Policy& policy);
// Throws [policy] when an fp32_ops entry matches no op (a typo would otherwise pin nothing), and
// for a 16-bit policy without capabilities (`backend.known()` false).
void apply_precision(Program& program, const Policy& policy, const OpCapabilities& backend);

}  // namespace memfit
