// Fused classifier (see classifier.hpp). Per chunk of R rows: one GEMM makes the logits, a
// row pass turns them in place into dlogits while computing each loss, then two GEMMs
// consume dlogits. The vocabulary-parallel ops (classifier_parallel.hpp) run the same chunks
// with another row pass (ClassifierPass). The subtle points: the padded columns j >= V get no
// probability and exactly zero gradient (so the padding rows of dwte receive exactly
// nothing), and the write mode of dwte applies to the first chunk only, since every later
// chunk adds to what the earlier ones wrote. Probabilities below 2^-64 are flushed to zero (softmax_exp): as
// subnormal GEMM operands they made the dwte product ~70x slower. In fp32, dx = dlogits wte
// (neither transposed) runs memfit's sgemm: ~300 GFLOP/s here, where oneDNN ran this
// layout at ~225 and the transposed form dx^T = wte^T dlogits^T (then transposed into
// place through the scratch) at ~265-289.
#include "kernels/cpu/classifier.hpp"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/error.hpp"
#include "core/half.hpp"
#include "kernels/cpu/parallel.hpp"
#include "kernels/cpu/sgemm.hpp"
#include "kernels/cpu/vec_math.hpp"

namespace memfit {
namespace {

MatmulAttrs logits_attrs(const ClassifierShape& s, int64_t rows) {
  MatmulAttrs a;
  a.m = rows, a.n = s.padded_vocab, a.k = s.channels, a.trans_b = true;
  return a;
}
// fp32 dx (rows, C) (+)= dlogits (rows, Vp) . wte (Vp, C), through sgemm; its scratch does
// not depend on the number of rows.
SgemmShape dx_sgemm(const ClassifierShape& s, int64_t rows) { return SgemmShape{rows, s.channels, s.padded_vocab}; }
MatmulAttrs dwte_attrs(const ClassifierShape& s, int64_t rows) {
  MatmulAttrs a;
  a.m = s.padded_vocab, a.n = s.channels, a.k = rows, a.trans_a = true;
  return a;
}

// The product specs the kernel needs, as (size index, spec) pairs, in one place so that
// scratch_bytes and the constructor agree. visit(kind, size, acc, spec); kind 0 logits,
// 1 dx, 2 dwte.
// bf16 products: logits in fp32 from bf16 operands; dx (rows, C) = dlogits wte and
// dwte (Vp, C) (+)= dlogits^T x with the bf16 dlogits dense at the start of the chunk (a
// dense operand gets oneDNN's AMX kernel; a strided one fell back to gemm:jit, which with a
// bf16 dwte asked for ~300 MiB of scratch).
DnnlMatmulSpec logits_spec(const ClassifierShape& s, int64_t rows) {
  return matmul_spec(logits_attrs(s, rows), false, false, MatmulTypes{s.dtype, s.dtype, DType::f32, DType::f32});
}
DnnlMatmulSpec dx_spec(const ClassifierShape& s, int64_t rows, bool acc) {
  DnnlMatmulSpec sp;
  sp.src = DnnlOperand{{rows, s.padded_vocab}, {s.padded_vocab, 1}, dnnl_type(s.dtype)};
  sp.wei = dnnl_matrix(s.padded_vocab, s.channels, false, dnnl_type(s.dtype));
  sp.dst = dnnl_matrix(rows, s.channels, false, dnnl_type(s.dtype));
  sp.accumulate = acc;
  return sp;
}
DnnlMatmulSpec dwte_spec(const ClassifierShape& s, int64_t rows, bool acc) {
  if (!s.bf16()) return matmul_spec(dwte_attrs(s, rows), false, acc);
  DnnlMatmulSpec sp;
  sp.src = DnnlOperand{{s.padded_vocab, rows}, {1, s.padded_vocab}, dnnl_type(s.dtype)};
  sp.wei = dnnl_matrix(rows, s.channels, false, dnnl_type(s.dtype));
  sp.dst = dnnl_matrix(s.padded_vocab, s.channels, false, dnnl_type(s.grad_dtype));
  sp.accumulate = acc;
  return sp;
}

template <class Visit>
void for_each_product(const ClassifierShape& s, const ClassifierOutputs& o, Visit visit) {
  const int64_t chunk = std::min(s.chunk_rows, s.rows);
  const int64_t full = s.rows / chunk, tail = s.rows % chunk;
  for (int size = 0; size < 2; ++size) {
    const int64_t rows = size == 0 ? chunk : tail;
    if (rows == 0) continue;
    visit(0, size, 0, logits_spec(s, rows));
    if (o.dx && s.bf16()) {
      if (o.dx_modes.overwrite) visit(1, size, 0, dx_spec(s, rows, false));
      if (o.dx_modes.accumulate) visit(1, size, 1, dx_spec(s, rows, true));
    }
    for (int acc = 0; acc < 2; ++acc) {
      // Only the first chunk (always a full one) can overwrite dwte; every other adds.
      const bool needed = acc ? (o.dwte_modes.accumulate || full > 1 || tail > 0)
                              : (size == 0 && o.dwte_modes.overwrite);
      if (o.dwte && needed) visit(2, size, acc, dwte_spec(s, rows, acc));
    }
  }
}

}  // namespace

ClassifierKernel::ClassifierKernel(const DnnlEnv& env, const ClassifierShape& shape, const ClassifierOutputs& outputs)
    : shape_(shape), outputs_(outputs) {
  // A vocabulary slice may hold no real column at all (the last ranks of a padded vocabulary).
  const bool fused = outputs.pass == ClassifierPass::fused;
  MEMFIT_CHECK(shape.rows > 0 && shape.channels > 0 && shape.chunk_rows > 0 && shape.vocab > 0 &&
                   shape.padded_vocab > 0 && shape.vocab_begin >= 0 &&
                   (!fused || (shape.vocab_begin == 0 && shape.vocab <= shape.padded_vocab)),
               "kernels", "classifier with rows={} channels={} chunk_rows={} vocab={} padded_vocab={} vocab_begin={}",
               shape.rows, shape.channels, shape.chunk_rows, shape.vocab, shape.padded_vocab, shape.vocab_begin);
  MEMFIT_CHECK(fused || !outputs.losses, "kernels", "the vocabulary-parallel classifier passes write no losses");
  MEMFIT_CHECK(shape.dtype == DType::f32 || (shape.bf16() && shape.grad_dtype != DType::f16), "kernels",
               "no CPU classifier over {} activations with {} gradients", dtype_name(shape.dtype),
               dtype_name(shape.grad_dtype));
  chunk_ = std::min(shape.chunk_rows, shape.rows);
  threads_ = omp_get_max_threads();
  full_chunks_ = shape.rows / chunk_;
  tail_rows_ = shape.rows % chunk_;
  for_each_product(shape, outputs, [&](int kind, int size, int acc, const DnnlMatmulSpec& spec) {
    DnnlMatmul& slot = kind == 0 ? logits_mm_[size] : kind == 1 ? dx_mm_[size][acc] : dwte_mm_[size][acc];
    slot = DnnlMatmul(env, spec);
  });
}

uint64_t ClassifierKernel::scratch_bytes(const DnnlEnv& env, const ClassifierShape& shape,
                                         const ClassifierOutputs& outputs) {
  uint64_t bytes = 0;
  for_each_product(shape, outputs, [&](int, int, int, const DnnlMatmulSpec& spec) {
    bytes = std::max(bytes, DnnlMatmul::scratch_bytes(env, spec));
  });
  // The sgemm of dx runs between the oneDNN products, so the two share the scratch.
  if (outputs.dx && !shape.bf16())
    bytes = std::max(bytes, sgemm_scratch_bytes(dx_sgemm(shape, std::min(shape.chunk_rows, shape.rows)),
                                                omp_get_max_threads()));
  return bytes;
}

void ClassifierKernel::bind(const void* x, const void* wte, const int32_t* targets, float* losses, void* dx,
                            void* dwte, float* logits, void* scratch, float* stats, const float* lse) {
  MEMFIT_ASSERT(bool(dx) == outputs_.dx && bool(dwte) == outputs_.dwte && bool(losses) == outputs_.losses,
                "classifier bound with other outputs than it was prepared for");
  MEMFIT_ASSERT(bool(stats) == (outputs_.pass == ClassifierPass::partial_stats) &&
                    bool(lse) == (outputs_.pass == ClassifierPass::backward_from_lse),
                "classifier bound without the stats or lse of its pass");
  stats_ = stats;
  lse_ = lse;
  const int64_t C = shape_.channels, w = shape_.bf16() ? 2 : 4;
  const int64_t chunks = full_chunks_ + (tail_rows_ > 0 ? 1 : 0);
  dx_ = dx;
  scratch_ = scratch;
  // Binding i of a full-size product is chunk i; the tail products have one binding.
  for (int64_t i = 0; i < chunks; ++i) {
    const int size = i < full_chunks_ ? 0 : 1;
    const void* xc = static_cast<const char*>(x) + i * chunk_ * C * w;
    logits_mm_[size].bind(xc, wte, nullptr, logits, scratch);
    for (int acc = 0; acc < 2 && shape_.bf16(); ++acc)
      if (dx_mm_[size][acc].valid())
        dx_mm_[size][acc].bind(logits, wte, nullptr, static_cast<char*>(dx) + i * chunk_ * C * w, scratch);
    for (int acc = 0; acc < 2; ++acc) {
      if (dwte_mm_[size][acc].valid() && (acc == 1 || i == 0))
        dwte_mm_[size][acc].bind(logits, xc, nullptr, dwte, scratch);
    }
  }
  targets_ = targets;
  losses_ = losses;
  logits_ = logits;
  wte_ = wte;
}

void ClassifierKernel::rows_pass(int64_t row0, int64_t count, float dscale) const {
  constexpr int64_t kSumBlock = 1024;
  // V: the chunk's real columns (all of the fused op's vocabulary, or a slice's part of it);
  // targets are global columns, this chunk's column j is global column begin + j.
  const int64_t V = shape_.real_columns(), Vp = shape_.padded_vocab, begin = shape_.vocab_begin;
  const int64_t vocab = shape_.vocab;
  const bool grad = outputs_.dx || outputs_.dwte, bf16 = shape_.bf16();
  const ClassifierPass pass = outputs_.pass;
  float* losses = losses_;
  float* stats = stats_;
  const float* lse = lse_;
  const int32_t* targets = targets_;
  float* logits = logits_;
  auto rows = [=](int64_t first, int64_t last) {
    for (int64_t i = first; i < last; ++i) {
      const int64_t global_target = targets[row0 + i];
      MEMFIT_ASSERT(global_target >= 0 && global_target < vocab, "target {} at row {} outside [0, {})", global_target,
                    row0 + i, vocab);
      // The target's column in this chunk, or -1 when another rank's slice holds it.
      const int64_t local = global_target - begin, target = local >= 0 && local < V ? local : -1;
      float* l = logits + i * Vp;
      // f: what the exponentials left in l[0, V) are multiplied by to become d(logits).
      float f = dscale;
      if (pass == ClassifierPass::backward_from_lse) {
        // The softmax's denominator is the whole vocabulary's, combined over the tensor group.
        const float row_lse = lse[row0 + i];
#pragma omp simd
        for (int64_t j = 0; j < V; ++j) l[j] = softmax_exp(l[j] - row_lse);
      } else {
        float mx = -std::numeric_limits<float>::infinity();
#pragma omp simd reduction(max : mx)
        for (int64_t j = 0; j < V; ++j) mx = l[j] > mx ? l[j] : mx;  // not std::max: see vec_math.hpp
        const float target_logit = target >= 0 ? l[target] : 0.0f;
        // The sum of up to ~1e5 exponentials: float lanes within blocks of kSumBlock columns,
        // the block sums in double. (A double reduction over the whole row halves the vector
        // width and made this pass 4x slower: 41 against 10 ms per 512 x 50304 chunk.) The
        // exponentials themselves are stored in place when a gradient follows.
        double sum = 0;
        for (int64_t j0 = 0; j0 < V; j0 += kSumBlock) {
          const int64_t j1 = std::min(V, j0 + kSumBlock);
          float block = 0;
          if (grad) {
#pragma omp simd reduction(+ : block)
            for (int64_t j = j0; j < j1; ++j) {
              l[j] = softmax_exp(l[j] - mx);
              block += l[j];
            }
          } else {
#pragma omp simd reduction(+ : block)
            for (int64_t j = j0; j < j1; ++j) block += softmax_exp(l[j] - mx);
          }
          sum += double(block);
        }
        if (stats) {  // a slice without real columns: mx = -inf, sum = 0, target logit 0
          float* st = stats + (row0 + i) * 3;
          st[0] = mx, st[1] = float(sum), st[2] = target_logit;
        }
        if (losses) losses[row0 + i] = float(std::log(sum) + double(mx) - double(target_logit));
        if (!grad) continue;
        f = float(double(dscale) / sum);
      }
      if (!bf16) {
#pragma omp simd
        for (int64_t j = 0; j < V; ++j) l[j] *= f;
        if (target >= 0) l[target] -= dscale;
        std::fill(l + V, l + Vp, 0.0f);
        continue;
      }
      // bf16 dlogits, dense: row i at bf16 element i Vp of the chunk. Row 0 overlaps its own
      // fp32 bytes, so it goes in pieces each read before written (bf16 element j lands on the
      // bytes of fp32 element j/2, already consumed); row i >= 1 lands on fp32 rows below i.
      constexpr int64_t kChunk = 256;
      bf16_t* out = reinterpret_cast<bf16_t*>(logits) + i * Vp;
      for (int64_t c0 = 0; c0 < Vp; c0 += kChunk) {
        const int64_t n = std::min(kChunk, Vp - c0), real = std::clamp<int64_t>(V - c0, 0, n);
        float tmp[kChunk];
#pragma omp simd
        for (int64_t j = 0; j < real; ++j) tmp[j] = l[c0 + j] * f;
        for (int64_t j = real; j < n; ++j) tmp[j] = 0.0f;
        if (target >= 0 && target >= c0 && target < c0 + n) tmp[target - c0] -= dscale;
#pragma omp simd
        for (int64_t j = 0; j < n; ++j) out[c0 + j] = narrow<bf16_t>(tmp[j]);
      }
    }
  };
  if (!(bf16 && grad)) return parallel_for(count, 1, rows);
  // Dense bf16 rows overwrite fp32 rows of lower index (row i lands on rows [i/2, (i+1)/2)),
  // so rows go in generations [1, 2), [2, 4), [4, 8), ...: each generation writes only over
  // rows an earlier one finished, and its own rows run in parallel.
  rows(0, 1);
  for (int64_t lo = 1; lo < count; lo *= 2) {
    const int64_t hi = std::min(count, 2 * lo);
    parallel_for(hi - lo, 1, [&](int64_t first, int64_t last) { rows(lo + first, lo + last); });
  }
}

void ClassifierKernel::run(float dscale, bool acc_dx, bool acc_dwte) const {
  const int64_t chunks = full_chunks_ + (tail_rows_ > 0 ? 1 : 0);
  for (int64_t i = 0; i < chunks; ++i) {
    const int size = i < full_chunks_ ? 0 : 1;
    const int index = size == 0 ? int(i) : 0;
    logits_mm_[size].execute(index);
    rows_pass(i * chunk_, size == 0 ? chunk_ : tail_rows_, dscale);
    if (outputs_.dx && shape_.bf16()) {
      const DnnlMatmul& mm = dx_mm_[size][acc_dx ? 1 : 0];
      MEMFIT_ASSERT(mm.valid(), "classifier prepared without its dx {} variant", acc_dx ? "accumulate" : "overwrite");
      mm.execute(index);
    } else if (outputs_.dx) {
      const int64_t rows = size == 0 ? chunk_ : tail_rows_;
      sgemm(dx_sgemm(shape_, rows), logits_, static_cast<const float*>(wte_), nullptr,
            static_cast<float*>(dx_) + i * chunk_ * shape_.channels, acc_dx, scratch_, threads_);
    }
    if (outputs_.dwte) {
      const bool acc = i > 0 || acc_dwte;
      const DnnlMatmul& mm = dwte_mm_[size][acc ? 1 : 0];
      MEMFIT_ASSERT(mm.valid(), "classifier prepared without its dwte {} variant", acc ? "accumulate" : "overwrite");
      // The overwrite variant has a single binding (chunk 0).
      mm.execute(acc ? index : 0);
    }
  }
}

}  // namespace memfit
