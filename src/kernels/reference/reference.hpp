// Naive reference kernels: the oracle that the CPU kernels are tested against, and the kernels
// of the reference backend (reference_backend.cpp, make_reference_backend()). Plain loops,
// one element at a time, double accumulation, no OpenMP and no oneDNN, written to be read
// rather than to be fast. Each is a template over the element type and is instantiated for
// float (to compare with the CPU kernels) and double (so that the backward kernels can be
// checked against central finite differences of the forward ones; see tests/kernels).
//
// Conventions follow graph/op.hpp. Every output takes an `acc` flag: false overwrites, true
// adds into the existing values. An output pointer may be nullptr where the op allows it
// (the kernel then skips that output). Shape letters: N rows, C channels, B batch, T
// sequence, NH heads, HS head size, V vocabulary, Vp padded vocabulary.
#pragma once

#include <cstdint>

#include "core/dropout_mask.hpp"

namespace memfit::ref {

// x[n] = wte[tokens[n]] + wpe[n % seq] for the N = B*seq rows; wpe may be nullptr (rotary models,
// or another tensor-parallel rank adds it). A vocabulary slice (vocab_rows >= 0): wte's row r is
// token vocab_begin + r, and a token outside the slice gets a zero table row.
template <class F>
void embedding_forward(const int32_t* tokens, const F* wte, const F* wpe, F* x, int64_t N, int64_t seq, int64_t C,
                       bool acc, int64_t vocab_begin = 0, int64_t vocab_rows = -1);
// dwte[tok] += dx rows; dwpe[t] += sum over the batch. Overwrite mode zeroes the whole
// tables (all Vp rows of dwte, all Tmax rows of dwpe) before scattering. `sliced`: dwte's row r
// is token vocab_begin + r, and tokens outside [vocab_begin, vocab_begin + vocab_rows) are
// skipped (without it they are an error).
template <class F>
void embedding_backward(const F* dx, const int32_t* tokens, F* dwte, F* dwpe, int64_t N, int64_t seq, int64_t C,
                        int64_t vocab_rows, int64_t max_seq, bool acc_wte, bool acc_wpe, int64_t vocab_begin = 0,
                        bool sliced = false);

template <class F>
void layernorm_forward(const F* x, const F* w, const F* b, F* y, F* mean, F* rstd, int64_t N, int64_t C, double eps);
template <class F>
void layernorm_backward(const F* dy, const F* x, const F* w, const F* mean, const F* rstd, F* dx, F* dw, F* db,
                        int64_t N, int64_t C, bool acc_dx, bool acc_dw, bool acc_db);

// C[M,N] = alpha * op(A) op(B) (+ bias[N]); A stored [M,K] or [K,M] (trans_a), B stored
// [K,N] or [N,K] (trans_b).
template <class F>
void matmul(const F* a, const F* b, const F* bias, F* c, int64_t M, int64_t N, int64_t K, bool trans_a,
            bool trans_b, double alpha, bool acc);
// db[n] = sum over rows of dy[m, n].
template <class F>
void bias_grad(const F* dy, F* db, int64_t M, int64_t N, bool acc);

template <class F>
void gelu_forward(const F* x, F* y, int64_t n, bool acc);
template <class F>
void gelu_backward(const F* dy, const F* x, F* dx, int64_t n, bool acc);

template <class F>
void add(const F* a, const F* b, F* y, int64_t n, bool acc);
// y = a (y += a when acc), then y[:, begin:begin+width] += d.
void add_columns(const float* a, const float* d, float* y, int64_t rows, int64_t cols, int64_t begin, int64_t width,
                 bool acc);
// y = x[:, begin:begin+width] (y += it when acc).
void slice_columns(const float* x, float* y, int64_t rows, int64_t cols, int64_t begin, int64_t width, bool acc);
// y = x * keep / (1 - p) (y += that when acc), keep from core/dropout_mask.hpp.
void dropout(const float* x, float* y, int64_t n, float p, uint64_t key, const DropoutLayout& layout, bool acc);
template <class F>
void accumulate(const F* x, F* y, int64_t n, bool acc);
template <class F>
void fill(F* x, int64_t n, double value, bool acc);
template <class F>
void loss_mean(const F* losses, F* loss, int64_t n, double scale, bool acc);

// Causal attention over qkv (B, T, 3C) laid out [q | k | v], head h at columns h*HS. With KV
// grouped kv heads (0: KV = NH) qkv is (B, T, (NH + 2KV) HS), NH query heads then KV key heads
// then KV value heads per token; query head h reads kv head h / (NH / KV); dqkv has qkv's
// layout, dk and dv of a kv head summed over its query heads. The forward's y may be nullptr
// (probabilities only, as a recomputation asks).
template <class F>
void attention_forward(const F* qkv, F* y, F* probs, int64_t B, int64_t T, int64_t NH, int64_t HS, double scale,
                       bool acc_y, int64_t KV = 0);
template <class F>
void attention_backward(const F* dy, const F* qkv, const F* probs, F* dqkv, int64_t B, int64_t T, int64_t NH,
                        int64_t HS, double scale, bool acc, int64_t KV = 0);

// The memory-efficient form: the forward keeps y and lse (B, NH, T), the log-sum-exp of each
// row of scaled scores; the backward rebuilds the probabilities from q, k and lse and uses
// D_t = dy_t . y_t in place of the row sums of probs * dprobs. lse is always fp32 in the CPU
// kernels; here it has the element type F so the double instance stays exact.
template <class F>
void flash_attention_forward(const F* qkv, F* y, F* lse, int64_t B, int64_t T, int64_t NH, int64_t HS, double scale,
                             int64_t KV = 0);
template <class F>
void flash_attention_backward(const F* dy, const F* qkv, const F* y, const F* lse, F* dqkv, int64_t B, int64_t T,
                              int64_t NH, int64_t HS, double scale, bool acc, int64_t KV = 0);

// Fused classifier: logits = x wte^T over all Vp columns; loss_i = logsumexp over the first V
// columns - logit[target]; dlogits = (softmax - onehot) * dscale on the first V columns and 0
// on the padding; dx = dlogits wte; dwte = dlogits^T x. Any output may be nullptr.
template <class F>
void classifier(const F* x, const F* wte, const int32_t* targets, F* losses, F* dx, F* dwte, int64_t N, int64_t C,
                int64_t V, int64_t Vp, double dscale, bool acc_dx, bool acc_dwte);

// --- tensor parallelism ---
// y[r] = x[r] + bias for each of the rows (y += that when acc); y may be x.
template <class F>
void add_bias(const F* x, const F* bias, F* y, int64_t rows, int64_t cols, bool acc);
// The vocabulary-parallel classifier over one slice w (Vs, C) whose row j is global column
// vocab_begin + j (real when < V). classifier_partial: per row {max logit m over the slice's
// real columns (-inf when none), sum of exp(logit - m) over them, the target's logit when the
// slice holds it (else 0)} into stats (N, 3).
template <class F>
void classifier_partial(const F* x, const F* w, const int32_t* targets, F* stats, int64_t N, int64_t C, int64_t V,
                        int64_t Vs, int64_t vocab_begin);
// stats (P, N, 3) of P slices -> lse = log of the summed exponentials, loss = lse - target logit.
template <class F>
void classifier_combine(const F* stats, F* losses, F* lse, int64_t P, int64_t N);
// g = (exp(logit - lse) - [column is the target]) * dscale on the real columns, 0 on padding;
// dx = g w and dw = g^T x (either may be nullptr).
template <class F>
void classifier_parallel_backward(const F* x, const F* w, const int32_t* targets, const F* lse, F* dx, F* dw,
                                  int64_t N, int64_t C, int64_t V, int64_t Vs, int64_t vocab_begin, double dscale,
                                  bool acc_dx, bool acc_dw);

// Round to nearest even of a real number into bf16 / fp16 bit patterns (NaN as the canonical
// quiet NaN). bf16 follows memfit's convention of flushing fp32 subnormals to zero.
uint16_t round_to_bf16_bits(double x);
uint16_t round_to_fp16_bits(double x);

// PyTorch's AdamW on one tensor; step is 1-based. The gradient used is grad * grad_scale
// (clipping coefficient over the loss scale, as the update ops of graph/op.hpp apply it).
template <class F>
void adamw(F* param, const F* grad, F* m, F* v, int64_t n, double lr, double beta1, double beta2, double eps,
           double weight_decay, int64_t step, double grad_scale = 1.0);

}  // namespace memfit::ref
