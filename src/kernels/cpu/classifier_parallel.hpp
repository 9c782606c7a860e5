// The vocabulary-parallel cross-entropy (graph/op.hpp, tensor parallelism): each rank of the
// tensor group holds a slice w (Vs, C) of the classifier's weight, global columns vocab_begin
// .. vocab_begin + Vs - 1, and no rank ever holds a row's whole logits.
//
//   classifier_partial           ClassifierKernel with ClassifierPass::partial_stats: the slice's
//                                logits chunk by chunk, and per row its max, its sum of
//                                exponentials and the target's logit (stats (N, 3) fp32);
//   classifier_combine           classifier_combine() below, after the stats were gathered;
//   classifier_parallel_backward ClassifierKernel with ClassifierPass::backward_from_lse: the
//                                logits again, d(logits) from the combined lse, and the fused
//                                op's two gradient products over the slice.
//
// The same chunked GEMMs as the fused op (classifier.hpp), so the same dtypes (f32, bf16) and
// the same write-mode handling of dx and dw.
#pragma once

#include <cstdint>

namespace memfit {

// stats (parts, rows, 3): per rank and row {m, s, t}. lse = M + log(sum_r s_r exp(m_r - M)) over
// the parts with s_r > 0 (M their max m_r), loss = lse - sum_r t_r; both in double, rounded once.
// Either output may be nullptr.
void classifier_combine(const float* stats, float* losses, float* lse, int parts, int64_t rows);

}  // namespace memfit
