// Per-layer activation memory under tensor parallelism against the closed form of Korthikanti
// et al. 2022 (Reducing Activation Recomputation in Large Transformer Models, eq. 2): with
// 16-bit activations, a GPT block keeps sbh(10 + 24/t + 5as/(ht)) bytes on each of t ranks.
// That count includes what memfit never stores: dropout masks (memfit draws each keep bit again
// from a counter-based hash in the backward: graph/op.hpp dropout_forward), i.e. the attention's
// mask and its dropped-out probabilities (3as^2b/t) and the two residual masks (2sbh). memfit
// keeps, and the formula leaves out, each norm's fp32 statistics (mean and rstd: 8 bytes per
// token per norm). So the oracle is exact:
//   memfit = sbh(10 + 24/t + 5as/(ht)) - 2sbh - 3as^2b/t + 16sb     (GPT, two LayerNorms)
// for GPT-3 175B's block (h 12288, a 96, s 2048, b 1) at t = 1, 2 and 8, planned by memfit on one
// rank of the group (the other ranks' programs are the same shapes).
// Llama-2-70B's block (grouped-query attention, SwiGLU, RMSNorm) is counted the same way from
// its own shapes, in 16-bit elements: the four replicated sbh tensors (each norm's input and
// output), and per rank q, k, v, the attention output, gate, up and their product, the softmax
// output, then the two fp32 rstd vectors:
//   2sb [4h + ((a + 2 kv) h/a + h + 3f)/t] + 2as^2b/t + 8sb.
#include <gtest/gtest.h>

#include "core/error.hpp"
#include "graph/training_program.hpp"
#include "kernels/backend.hpp"
#include "plan/memory_plan.hpp"
#include "plan/saved_activations.hpp"

namespace memfit {
namespace {

Policy korthikanti_policy(int64_t seq) {
  Policy p;
  p.batch = 1;
  p.seq = seq;
  p.precision = Precision::bf16;
  p.grad_dtype = DType::bf16;
  p.attention = AttentionKind::plain;  // the formula keeps the softmax output
  p.with_eval = false;
  return p;
}

// One block of GPT-3 175B (h 12288, a 96, 4h MLP, 2048 positions) on GPT-2's vocabulary.
ModelSpec gpt3_block() {
  ModelSpec spec = model_preset("gpt2");
  spec.name = "gpt3-175b-block";
  spec.n_layer = 1;
  spec.n_head = spec.n_kv_head = 96;
  spec.n_embd = 12288;
  spec.n_inner = 4 * 12288;
  spec.max_seq = 2048;
  return spec;
}

uint64_t planned_layer_bytes(const ModelSpec& spec, const Policy& policy, int tensor) {
  const Program p = build_training_program(spec, policy, Topology{.data = 1, .tensor = tensor, .rank = 0},
                                           cpu_capabilities());
  const std::vector<uint64_t> bytes = saved_activations_by_layer(p, plan_memory(p));
  EXPECT_EQ(bytes.size(), size_t(spec.n_layer));
  return bytes.empty() ? 0 : bytes[0];
}

TEST(TensorParallelActivations, Gpt3BlockIsKorthikantiWithoutDropoutMasksPlusNormStatistics) {
  const ModelSpec spec = gpt3_block();
  const double s = 2048, b = 1, h = 12288, a = 96;
  for (int t : {1, 2, 8}) {
    SCOPED_TRACE(t);
    const double korthikanti = s * b * h * (10 + 24.0 / t + 5 * a * s / (h * t));
    const double expected = korthikanti - 2 * s * b * h - 3 * a * s * s * b / t + 16 * s * b;
    const uint64_t planned = planned_layer_bytes(spec, korthikanti_policy(2048), t);
    EXPECT_EQ(double(planned), expected);
    std::printf("  GPT-3 175B block, t = %d: memfit %.1f MiB per layer, Korthikanti %.1f MiB (%.3f)\n", t,
                double(planned) / (1 << 20), korthikanti / (1 << 20), double(planned) / korthikanti);
  }
}

// With sequence parallelism the replicated part is split too: sbh/t (34 + 5as/h) in the paper
// (eq. 4), the same masks left out and the norms' statistics (now of N/t rows) added.
TEST(TensorParallelActivations, Gpt3BlockWithSequenceParallelismIsKorthikantiEquationFour) {
  const ModelSpec spec = gpt3_block();
  const double s = 2048, b = 1, h = 12288, a = 96;
  Policy policy = korthikanti_policy(2048);
  policy.sequence_parallel = true;
  for (int t : {2, 8}) {
    SCOPED_TRACE(t);
    const double korthikanti = s * b * h / t * (34 + 5 * a * s / h);
    const double expected = korthikanti - 2 * s * b * h / t - 3 * a * s * s * b / t + 16 * s * b / t;
    const uint64_t planned = planned_layer_bytes(spec, policy, t);
    EXPECT_EQ(double(planned), expected);
    std::printf("  GPT-3 175B block, t = %d, sequence parallel: memfit %.1f MiB per layer, Korthikanti %.1f MiB (%.3f)\n",
                t, double(planned) / (1 << 20), korthikanti / (1 << 20), double(planned) / korthikanti);
  }
}

TEST(TensorParallelActivations, Llama70bBlockKeepsItsShapesSlices) {
  ModelSpec spec = model_preset("llama-2-70b");
  spec.n_layer = 1;
  const double s = 4096, b = 1, h = double(spec.n_embd), a = double(spec.n_head), kv = double(spec.n_kv_head),
               f = double(spec.n_inner);
  for (int t : {1, 8}) {
    SCOPED_TRACE(t);
    const double expected =
        2 * s * b * (4 * h + ((a + 2 * kv) * h / a + h + 3 * f) / t) + 2 * a * s * s * b / t + 8 * s * b;
    EXPECT_EQ(double(planned_layer_bytes(spec, korthikanti_policy(4096), t)), expected);
  }
}

// A degree that does not divide the heads is refused in one line, before anything is built.
TEST(TensorParallelActivations, UnevenKeyValueHeadsAreRefused) {
  const ModelSpec spec = model_preset("llama-2-70b");  // 8 key/value heads
  try {
    build_training_program(spec, korthikanti_policy(128), Topology{.data = 1, .tensor = 16, .rank = 0},
                           cpu_capabilities());
    FAIL() << "16-way tensor parallelism of 8 key/value heads was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("key/value heads"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace memfit
