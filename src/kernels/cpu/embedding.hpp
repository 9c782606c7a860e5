// Token + position embedding and its backward.
#pragma once

#include <cstdint>

namespace memfit {

// x[n] = wte[tokens[n]] + wpe[n % seq] for the N = B*seq rows of C channels (x += when acc).
// Tokens must lie in [0, vocab_rows); anything else aborts rather than reading outside wte.
void embedding_forward(const int32_t* tokens, const float* wte, const float* wpe, float* x, int64_t N, int64_t seq,
                       int64_t C, int64_t vocab_rows, bool acc);

// dwte[tokens[n]] += dx[n]; dwpe[t] += sum over the batch of dx[b, t]. In overwrite mode the
// whole of dwte (all vocab_rows) and of dwpe (all max_seq rows) is zeroed first. Either
// output may be nullptr. Results are bit-identical for any thread count.
void embedding_backward(const float* dx, const int32_t* tokens, float* dwte, float* dwpe, int64_t N, int64_t seq,
                        int64_t C, int64_t vocab_rows, int64_t max_seq, bool acc_wte, bool acc_wpe);

}  // namespace memfit
