// Size bounds, checked before a program is built (ModelSpec::validate, the policy checks of
// build_training_program), while it is built (Program::add_tensor) and when it is planned
// (plan_memory): each refusal names the field, and no size overflows on the way. The sizes are
// those a fuzzing campaign crashed `memfit plan` and `memfit train` with.
#include <gtest/gtest.h>

#include <chrono>
#include <string>

#include "core/checked.hpp"
#include "core/error.hpp"
#include "graph/training_program.hpp"
#include "kernels/backend.hpp"
#include "plan/memory_plan.hpp"
#include "support/hand_built.hpp"

namespace memfit {
namespace {

using test::error_of;

ModelSpec gpt2_like(int64_t layers, int64_t heads, int64_t channels, int64_t vocab, int64_t context) {
  ModelSpec s = model_preset("gpt2-tiny");
  s.name = "test";
  s.n_layer = layers;
  s.n_head = s.n_kv_head = heads;
  s.n_embd = channels;
  s.n_inner = checked_mul<int64_t>(4, channels, "n_inner");
  s.vocab_size = vocab;
  s.padded_vocab = pad_vocab(vocab);
  s.max_seq = context;
  return s;
}

Policy batch_of(int64_t b, int64_t t, AttentionKind attention = AttentionKind::plain) {
  Policy p;
  p.batch = b;
  p.seq = t;
  p.attention = attention;
  return p;
}

void expect_refused(const ModelSpec& s, const std::string& needle) {
  const std::string e = error_of([&] { s.validate(); });
  EXPECT_EQ(e.rfind("[model] model 'test'", 0), 0u) << e;
  EXPECT_NE(e.find(needle), std::string::npos) << "expected '" << needle << "' in: " << e;
}

TEST(SizeBounds, EveryPresetIsInsideTheBounds) {
  for (const std::string& name : model_preset_names()) EXPECT_NO_THROW(model_preset(name).validate()) << name;
}

TEST(SizeBounds, ModelSizesBeyondTheKernelsOrAnyMachineAreRefusedByName) {
  // The campaign's crashes: n_embd 2^30 (SIGFPE), 2147483584 (a negative element count).
  expect_refused(gpt2_like(1, 1, int64_t(1) << 30, 256, 256), "n_inner (MLP width) 4294967296");
  expect_refused(gpt2_like(1, 1, 2147483584, 256, 256), "n_inner (MLP width) 8589934336");
  ModelSpec wide = gpt2_like(1, 1, 1 << 20, 256, 256);
  wide.n_inner = 1 << 20;
  wide.n_embd = (int64_t(1) << 31) - 64;  // C fits, but the fused q/k/v projection has 3C rows
  expect_refused(wide, "q/k/v projection has 6442450752 rows");
  expect_refused(gpt2_like(1'000'000'000, 4, 128, 256, 256), "n_layer 1000000000 exceeds 10000");
  expect_refused(gpt2_like(1, 4, 128, (int64_t(1) << 31) - 1, 256), "padded_vocab");
  expect_refused(gpt2_like(1, 4, 128, 256, int64_t(1) << 31), "max_seq (context length) 2147483648");
  expect_refused(gpt2_like(1, 3, 128, 256, 256), "do not split into 3 heads");
  // In range one by one, too many together: 12 x 2^40 x 10,000 parameters.
  expect_refused(gpt2_like(10'000, 16, 1 << 20, 256, 256), "parameters, above the 1125899906842624 (2^50)");
  // llama with every dimension in range: C x F x 3 overflows int64 before the parameter bound
  // is reached, and is named, not wrapped.
  ModelSpec llama = model_preset("llama-tiny");
  llama.name = "test";
  llama.n_head = 1024;
  llama.n_kv_head = 1;
  llama.n_embd = (int64_t(1) << 31) - (int64_t(1) << 22);  // q/k/v rows: 2147475456
  llama.n_inner = (int64_t(1) << 31) - 1;
  llama.max_seq = 16;
  const std::string e = error_of([&] { llama.validate(); });
  EXPECT_EQ(e, "[model] model 'test': parameters of the MLP: 4602678817029357568 x 3 overflows 64-bit integers");
  // At the bounds: accepted.
  EXPECT_NO_THROW(gpt2_like(10'000, 4, 128, 256, 256).validate());
  EXPECT_NO_THROW(gpt2_like(1, 1, 64, (int64_t(1) << 31) - 64, 1).validate());
}

TEST(SizeBounds, BatchShapesBeyondTheKernelsAreRefusedBeforeAnythingIsBuilt) {
  const ModelSpec s = gpt2_like(1, 4, 128, 256, 1 << 20);
  // batch x seq = 2^32: SIGFPE inside oneDNN before the bound existed.
  std::string e = error_of([&] { build_training_program(s, batch_of(1 << 12, 1 << 20), {}, cpu_capabilities()); });
  EXPECT_NE(e.find("[policy] batch x sequence length = 4096 x 1048576 = 4294967296 rows, above 2147483647"),
            std::string::npos) << e;
  e = error_of([&] { build_training_program(s, batch_of(INT64_MAX, 64), {}, cpu_capabilities()); });
  EXPECT_NE(e.find("[policy] batch x sequence length: 9223372036854775807 x 64 overflows"), std::string::npos) << e;
  // Plain attention's probabilities: 2^10 x 4 x 2^20 x 2^20 elements in one tensor (2^30 rows
  // are fine); flash attention keeps none of them.
  e = error_of([&] { build_training_program(s, batch_of(1 << 10, 1 << 20), {}, cpu_capabilities()); });
  EXPECT_NE(e.find("plain attention keeps 1024 x 4 x 1048576 x 1048576 = 4503599627370496 probabilities"),
            std::string::npos) << e;
  EXPECT_NE(e.find("--attention flash"), std::string::npos) << e;
}

TEST(SizeBounds, ATensorLargerThanATierIsRefusedByName) {
  // 2^21 rows of an MLP 2^30 wide: 2^51 fp32 elements, 8 PiB in one activation.
  ModelSpec s = gpt2_like(1, 1, 64, 256, 1 << 21);
  s.n_inner = int64_t(1) << 30;
  const std::string e = error_of([&] { build_training_program(s, batch_of(1, 1 << 21, AttentionKind::flash), {}, cpu_capabilities()); });
  EXPECT_EQ(e.rfind("[graph] tensor 'h.0.mlp.c_fc.y' fp32 (1, 2097152, 1073741824) needs 9007199254740992 bytes", 0),
            0u) << e;
}

TEST(SizeBounds, APlanAboveOnePebibytePerTierIsRefusedWithItsFigure) {
  // 2,000 layers of 2^16 channels: 1.03e14 parameters (below 2^50), whose weights and AdamW
  // state alone are 12 bytes each: 1.24e15 bytes, above 1 PiB.
  const ModelSpec s = gpt2_like(2000, 16, 1 << 16, 256, 8);
  ASSERT_NO_THROW(s.validate());
  const Program p = build_training_program(s, batch_of(1, 8), {}, cpu_capabilities());
  const std::string e = error_of([&] { plan_memory(p); });
  EXPECT_EQ(e.rfind("[plan] the device tier needs 1.", 0), 0u) << e;
  EXPECT_NE(e.find("PiB ("), std::string::npos) << e;
  EXPECT_NE(e.find("above 1.00 PiB"), std::string::npos) << e;
  // Just below: planned, with every figure exact (parameters 4 bytes each at the peak).
  const ModelSpec smaller = gpt2_like(100, 16, 1 << 16, 256, 8);
  const MemoryPlan plan = plan_memory(build_training_program(smaller, batch_of(1, 8), {}, cpu_capabilities()));
  const TierPlan& t = plan.tier(Tier::device);
  EXPECT_GT(t.peak_bytes, uint64_t(smaller.parameter_count()) * 12);
  EXPECT_LE(t.peak_bytes, kMaxTierBytes);
  EXPECT_EQ(t.at_peak[size_t(Category::parameters)], uint64_t(smaller.parameter_count()) * 4);
}

}  // namespace
}  // namespace memfit
