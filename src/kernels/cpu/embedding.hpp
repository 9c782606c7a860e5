// Token + position embedding and its backward.
#pragma once

#include <cstdint>

namespace memfit {

// Templates over the storage type T of tables and activations and G of the table gradients
// (float, bf16_t, fp16_t; half.hpp); sums in fp32.

// Vocabulary slices (tensor parallelism, EmbeddingAttrs): with `sliced`, wte's row r is token
// vocab_begin + r and a token outside [vocab_begin, vocab_begin + vocab_rows) is another rank's:
// its row of x gets no table row (zero, or only wpe) and it scatters nothing into dwte. Without
// it (one rank, vocab_begin 0) a token outside the table aborts. Negative tokens always abort.

// x[n] = wte[tokens[n]] + wpe[n % seq] for the N = B*seq rows of C channels (x += when acc);
// wpe may be nullptr (rotary models have no position table, or another rank adds it):
// x[n] = wte[tokens[n]]. Tokens must lie in [0, vocab_rows) (see above for slices); anything
// else aborts rather than reading outside wte.
template <class T>
void embedding_forward(const int32_t* tokens, const T* wte, const T* wpe, T* x, int64_t N, int64_t seq, int64_t C,
                       int64_t vocab_rows, bool acc, int64_t vocab_begin = 0, bool sliced = false);

// dwte[tokens[n]] += dx[n]; dwpe[t] += sum over the batch of dx[b, t]. In overwrite mode the
// whole of dwte (all vocab_rows) and of dwpe (all max_seq rows) is zeroed first. Either
// output may be nullptr. Results are bit-identical for any thread count. With a 16-bit G,
// every scatter-add into dwte rounds (a row hit by k tokens is rounded k times); dwpe is
// summed over the batch in fp32 and rounded once.
template <class T, class G>
void embedding_backward(const T* dx, const int32_t* tokens, G* dwte, G* dwpe, int64_t N, int64_t seq, int64_t C,
                        int64_t vocab_rows, int64_t max_seq, bool acc_wte, bool acc_wpe, int64_t vocab_begin = 0,
                        bool sliced = false);

}  // namespace memfit
