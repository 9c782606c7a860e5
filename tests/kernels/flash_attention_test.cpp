// Flash attention, three ways:
// - the reference flash formulas (double) against the plain reference attention, which the
//   gradcheck test verifies by finite differences: same y, lse = log-sum-exp of the scores,
//   same gradients;
// - the CPU kernel (through the backend, as the executor runs it) against the reference flash
//   on ragged shapes: T not a multiple of the 64-row tile, head sizes that are not a multiple
//   of 16, both write modes of dqkv, and one long sequence (T = 8192);
// - the CPU kernel against the CPU plain kernel (the 1e-5 relative bound), at
//   GPT-2's head shape;
// - the CPU kernel in every storage type gives the same bits whatever its scratch held before
//   (in a step it holds the previous op's bytes).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include <omp.h>
#include <vector>

#include <fmt/format.h>

#include "core/half.hpp"
#include "kernel_test_util.hpp"
#include "kernels/cpu/flash_attention.hpp"
#include "kernels/backend.hpp"
#include "kernels/reference/reference.hpp"
#include "program_fixture.hpp"

namespace memfit {
namespace {

using test::normalized_error;
using test::ProgramFixture;
using test::random_vector;
using Vec = std::vector<float>;

constexpr double kTol = 1e-5;

AttentionAttrs attrs(int64_t B, int64_t T, int64_t NH, int64_t HS) {
  AttentionAttrs a;
  a.batch = B, a.seq = T, a.heads = NH, a.kv_heads = NH, a.head_dim = HS, a.scale = 1.0f / std::sqrt(float(HS));
  return a;
}

TEST(FlashAttentionReference, EqualsPlainAttentionWithLogSumExp) {
  const int64_t B = 2, T = 9, NH = 2, HS = 5, C = NH * HS;
  const double scale = 0.4;
  const auto qkv = random_vector<double>(B * T * 3 * C, 1, -2, 2), dy = random_vector<double>(B * T * C, 2);
  std::vector<double> y(B * T * C), probs(B * NH * T * T), dqkv(B * T * 3 * C);
  std::vector<double> fy(B * T * C), lse(B * NH * T), fdqkv(B * T * 3 * C, 7.0);
  ref::attention_forward(qkv.data(), y.data(), probs.data(), B, T, NH, HS, scale, false);
  ref::attention_backward(dy.data(), qkv.data(), probs.data(), dqkv.data(), B, T, NH, HS, scale, false);
  ref::flash_attention_forward(qkv.data(), fy.data(), lse.data(), B, T, NH, HS, scale);
  ref::flash_attention_backward(dy.data(), qkv.data(), fy.data(), lse.data(), fdqkv.data(), B, T, NH, HS, scale, false);
  EXPECT_LE(normalized_error(fy, y), 1e-13);
  EXPECT_LE(normalized_error(fdqkv, dqkv), 1e-13);
  // lse: every probability is exp(score - lse); check it on the first query (only key 0
  // visible: lse is exactly its score) and through probs elsewhere.
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < NH; ++h)
      for (int64_t t = 0; t < T; ++t) {
        const double* q = qkv.data() + (b * T + t) * 3 * C + h * HS;
        const double* k = qkv.data() + (b * T + 0) * 3 * C + C + h * HS;
        double s0 = 0;
        for (int64_t d = 0; d < HS; ++d) s0 += q[d] * k[d];
        const double p0 = probs[size_t(((b * NH + h) * T + t) * T)];
        EXPECT_NEAR(std::exp(scale * s0 - lse[size_t((b * NH + h) * T + t)]), p0, 1e-13);
      }
}

struct FlashRun {
  Vec y, lse, dqkv;
};

// Forward then backward through a backend (make_backend); dqkv starts at `dqkv0` (accumulate
// mode adds to it).
FlashRun run_flash(const AttentionAttrs& a, const Vec& qkv, const Vec& dy, const Vec& dqkv0, WriteMode mode,
                   const std::string& backend_name = "cpu") {
  auto backend = make_backend(backend_name);
  ProgramFixture f;
  const int64_t B = a.batch, T = a.seq, NH = a.heads, C = NH * a.head_dim;
  const TensorId tq = f.tensor("qkv", {B, T, 3 * C}), ty = f.tensor("y", {B, T, C}), tl = f.tensor("lse", {B, NH, T});
  const TensorId tdy = f.tensor("dy", {B, T, C}), tdq = f.tensor("dqkv", {B, T, 3 * C});
  const int fwd = f.op(OpKind::flash_attention_forward, {tq}, {ty, tl}, a);
  const int bwd = f.op(OpKind::flash_attention_backward, {tdy, tq, ty, tl}, {tdq}, a, {mode});
  f.set(tq, qkv), f.set(tdy, dy), f.set(tdq, dqkv0);
  f.prepare(*backend, fwd)->run(StepContext{});
  f.prepare(*backend, bwd)->run(StepContext{});
  return {f.get(ty), f.get(tl), f.get(tdq)};
}

void expect_matches_reference(int64_t B, int64_t T, int64_t NH, int64_t HS, WriteMode mode, uint32_t seed,
                              const std::string& backend = "cpu") {
  const AttentionAttrs a = attrs(B, T, NH, HS);
  const int64_t C = NH * HS;
  const Vec qkv = random_vector(B * T * 3 * C, seed, -2, 2), dy = random_vector(B * T * C, seed + 1);
  const Vec dqkv0 = random_vector(B * T * 3 * C, seed + 2);
  const FlashRun got = run_flash(a, qkv, dy, dqkv0, mode, backend);
  Vec y(B * T * C), lse(B * NH * T), dqkv = dqkv0;
  ref::flash_attention_forward(qkv.data(), y.data(), lse.data(), B, T, NH, HS, double(a.scale));
  ref::flash_attention_backward(dy.data(), qkv.data(), y.data(), lse.data(), dqkv.data(), B, T, NH, HS,
                                double(a.scale), mode == WriteMode::accumulate);
  const std::string what = fmt::format("{}: B={} T={} NH={} HS={}", backend, B, T, NH, HS);
  std::printf("%s: normalised error y %.2g, lse %.2g, dqkv %.2g\n", what.c_str(), normalized_error(got.y, y),
              normalized_error(got.lse, lse), normalized_error(got.dqkv, dqkv));
  EXPECT_LE(normalized_error(got.y, y), kTol) << what;
  EXPECT_LE(normalized_error(got.lse, lse), kTol) << what;
  EXPECT_LE(normalized_error(got.dqkv, dqkv), kTol) << what;
}

// On every backend (kernels/backend.hpp), in the manner of ggml's test-backend-ops.
class FlashAttentionOnBackend : public ::testing::TestWithParam<std::string> {};
INSTANTIATE_TEST_SUITE_P(Backends, FlashAttentionOnBackend, ::testing::Values("cpu", "reference"),
                         [](const ::testing::TestParamInfo<std::string>& info) { return info.param; });

TEST_P(FlashAttentionOnBackend, MatchesReferenceOnRaggedShapes) {
  expect_matches_reference(1, 1, 1, 8, WriteMode::overwrite, 10, GetParam());      // one visible key
  expect_matches_reference(2, 13, 3, 8, WriteMode::accumulate, 20, GetParam());    // less than one tile
  expect_matches_reference(1, 64, 2, 32, WriteMode::overwrite, 30, GetParam());    // exactly one tile
  expect_matches_reference(2, 65, 2, 20, WriteMode::overwrite, 40, GetParam());    // one row into the second tile
  expect_matches_reference(1, 200, 3, 64, WriteMode::accumulate, 50, GetParam());  // ragged last tile, GPT-2's head size
  expect_matches_reference(1, 130, 1, 80, WriteMode::overwrite, 60, GetParam());   // head size above one 64-column block
}

TEST(FlashAttentionKernel, LongSequenceMatchesReference) {
  // 128 key tiles per row: the running maximum and sum are rescaled up to 128 times, and dq
  // sums 128 tile products. A small head keeps the double reference to a few seconds.
  expect_matches_reference(1, 8192, 1, 16, WriteMode::overwrite, 70);
}

TEST(FlashAttentionKernel, WithinOneMillionthOfThePlainKernel) {
  for (const int64_t T : {256, 1024}) {
    const AttentionAttrs a = attrs(1, T, 2, 64);
    const int64_t B = a.batch, NH = a.heads, C = NH * a.head_dim;
    const Vec qkv = random_vector(B * T * 3 * C, 80, -2, 2), dy = random_vector(B * T * C, 81);
    const FlashRun flash = run_flash(a, qkv, dy, Vec(B * T * 3 * C), WriteMode::overwrite);

    auto backend = make_cpu_backend();
    ProgramFixture f;
    const TensorId tq = f.tensor("qkv", {B, T, 3 * C}), ty = f.tensor("y", {B, T, C});
    const TensorId tp = f.tensor("probs", {B, NH, T, T}), tdy = f.tensor("dy", {B, T, C});
    const TensorId tdq = f.tensor("dqkv", {B, T, 3 * C}), tdp = f.tensor("dprobs", {B, NH, T, T});
    const int fwd = f.op(OpKind::attention_forward, {tq}, {ty, tp}, a);
    const int bwd = f.op(OpKind::attention_backward, {tdy, tq, tp}, {tdq}, a, {WriteMode::overwrite}, {tdp});
    f.set(tq, qkv), f.set(tdy, dy);
    f.prepare(*backend, fwd)->run(StepContext{});
    f.prepare(*backend, bwd)->run(StepContext{});
    std::printf("T=%ld: flash vs plain kernel: y %.2g, dqkv %.2g\n", long(T), normalized_error(flash.y, f.get(ty)),
                normalized_error(flash.dqkv, f.get(tdq)));
    EXPECT_LE(normalized_error(flash.y, f.get(ty)), kTol) << "T=" << T;
    EXPECT_LE(normalized_error(flash.dqkv, f.get(tdq)), kTol) << "T=" << T;
  }
}

// Forward then backward on a scratch first filled with `fill` bytes; y, lse and dqkv as bits.
template <class T>
std::vector<uint32_t> flash_bits(const AttentionShape& s, unsigned char fill) {
  const int64_t N = s.batch * s.seq;
  std::vector<T> qkv, dy, y(size_t(N * s.channels())), dqkv(size_t(N * s.qkv_channels()));
  for (float v : random_vector(size_t(N * s.qkv_channels()), 90, -2, 2)) qkv.push_back(narrow<T>(v));
  for (float v : random_vector(size_t(N * s.channels()), 91)) dy.push_back(narrow<T>(v));
  std::vector<float> lse(size_t(s.batch * s.heads * s.seq));
  const int threads = omp_get_max_threads();
  std::vector<unsigned char> scratch(
      std::max(flash_forward_scratch_bytes(s, threads), flash_backward_scratch_bytes(s, threads)), fill);
  flash_attention_forward(s, qkv.data(), y.data(), lse.data(), scratch.data(), threads);
  std::fill(scratch.begin(), scratch.end(), fill);
  flash_attention_backward(s, dy.data(), qkv.data(), y.data(), lse.data(), dqkv.data(), false, scratch.data(), threads);
  std::vector<uint32_t> bits;
  auto add = [&](const auto& v) {
    for (const auto& x : v) {
      uint32_t b = 0;
      std::memcpy(&b, &x, sizeof(x));
      bits.push_back(b);
    }
  };
  add(y), add(lse), add(dqkv);
  return bits;
}

// A first key block that read its running sum from the scratch gave NaN rows after any op that
// left NaN bytes there (fp16 QLoRA's islands did); zeroed scratch hid it.
TEST(FlashAttentionKernel, OutputsIgnoreWhatTheScratchHeld) {
  AttentionShape s;
  s.batch = 2, s.seq = 130, s.heads = 4, s.kv_heads = 2, s.head_dim = 32, s.scale = 1.0f / std::sqrt(32.0f);
  EXPECT_EQ(flash_bits<float>(s, 0xff), flash_bits<float>(s, 0));
  EXPECT_EQ(flash_bits<fp16_t>(s, 0xff), flash_bits<fp16_t>(s, 0));
  EXPECT_EQ(flash_bits<bf16_t>(s, 0xff), flash_bits<bf16_t>(s, 0));
}

TEST(FlashAttentionKernel, ScratchGrowsLinearlyWithSequence) {
  // The kernel's only memory besides its inputs and outputs: O(T) per thread, never O(T^2).
  auto backend = make_cpu_backend();
  auto scratch = [&](int64_t T, OpKind kind) {
    ProgramFixture f;
    const AttentionAttrs a = attrs(1, T, 12, 64);
    const int64_t C = 12 * 64;
    const TensorId q = f.tensor("qkv", {1, T, 3 * C}), y = f.tensor("y", {1, T, C}), l = f.tensor("lse", {1, 12, T});
    const int op = kind == OpKind::flash_attention_forward
                       ? f.op(kind, {q}, {y, l}, a)
                       : f.op(kind, {f.tensor("dy", {1, T, C}), q, y, l}, {f.tensor("dqkv", {1, T, 3 * C})}, a);
    return backend->scratch_bytes(f.program, f.program.op(op));
  };
  for (OpKind kind : {OpKind::flash_attention_forward, OpKind::flash_attention_backward}) {
    const uint64_t s1 = scratch(1024, kind), s8 = scratch(8192, kind);
    EXPECT_GT(s1, 0u);
    EXPECT_LE(s8, 8 * s1) << op_kind_name(kind);
    EXPECT_LT(s8, uint64_t(8192) * 8192 * 4 / 16) << op_kind_name(kind);  // far below one T x T head
  }
}

}  // namespace
}  // namespace memfit
