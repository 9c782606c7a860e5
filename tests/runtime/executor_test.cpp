// The executor's two promises on a real program (gpt2-tiny, training and validation; also
// with accumulation, 8-bit AdamW and gradient clipping):
// after start-up a step allocates nothing (memfit code: zero allocations; oneDNN: what it
// allocates inside a call is freed before the call returns), and the arena's measured
// high-water mark equals the planned peak byte for byte.
#include <gtest/gtest.h>

#include "core/error.hpp"
#include "graph/precision.hpp"
#include "graph/training_program.hpp"
#include "runtime/executor.hpp"
#include "support/alloc_counter.hpp"
#include "support/tiny_run.hpp"

namespace memfit {
namespace {

void expect_steps_allocate_nothing(Policy pol) {
  test::TinyRun run(pol);
  StepContext ctx;
  ctx.lr = 1e-3f;
  ctx.step = 1;
  run.ex->run_step(ctx);  // step 1 warms up OpenMP and oneDNN
  run.ex->run_section(SectionKind::eval, ctx);
  test::alloc_counter_start();
  for (ctx.step = 2; ctx.step <= 5; ++ctx.step) {
    run.ex->run_step(ctx);
    run.ex->run_section(SectionKind::eval, ctx);
  }
  const test::AllocCounts counts = test::alloc_counter_stop();
  EXPECT_EQ(counts.memfit_allocations, 0);
  EXPECT_EQ(counts.library_bytes_outstanding, 0);
  std::printf("steps 2..5: memfit allocations %ld; oneDNN allocations inside calls %ld (largest %ld B, all freed)\n",
              long(counts.memfit_allocations), long(counts.library_allocations), long(counts.library_max_bytes));

  const uint64_t planned = run.compiled.plan.tier(Tier::device).peak_bytes;
  EXPECT_EQ(run.ex->arena(Tier::device).measured_high_water(), planned);
  EXPECT_EQ(run.ex->arena(Tier::host).measured_high_water(), 0u);
  EXPECT_EQ(run.ex->arena(Tier::disk).measured_high_water(), 0u);
}

TEST(Executor, StepsAllocateNothingAndHighWaterEqualsPlan) {
  Policy pol;
  pol.batch = 4;
  pol.seq = 64;
  expect_steps_allocate_nothing(pol);
}

TEST(Executor, SameWithAccumulationAndChunkedClassifier) {
  Policy pol;
  pol.batch = 2;
  pol.seq = 96;
  pol.grad_accum = 3;
  pol.classifier_chunk_rows = 80;  // 192 rows in chunks of 80, 80, 32
  expect_steps_allocate_nothing(pol);
}

// Mixed precision: 16-bit parameters and activations, fp32 masters, casts and (fp16) fp32
// islands around the products and the overflow check; also with accumulation (persistent
// gradients, written with accumulate_after_first_micro through the islands' casts) and with
// 16-bit gradients.
TEST(Executor, SameUnderBf16AndFp16) {
  for (Precision precision : {Precision::bf16, Precision::fp16}) {
    for (DType grads : {DType::f32, compute_dtype(precision)}) {
      Policy pol;
      pol.batch = 2;
      pol.seq = 64;
      pol.grad_accum = grads == DType::f32 ? 1 : 2;
      pol.precision = precision;
      pol.grad_dtype = grads;
      pol.classifier_chunk_rows = 48;  // 128 rows in chunks of 48, 48, 32
      SCOPED_TRACE(fmt::format("{} with {} gradients", precision_name(precision), dtype_name(grads)));
      expect_steps_allocate_nothing(pol);
    }
  }
}

TEST(Executor, SameWithEightBitAdamWClippingAndAccumulation) {
  Policy pol;
  pol.batch = 2;
  pol.seq = 64;
  pol.grad_accum = 3;
  pol.optimizer = OptimizerKind::adamw8bit;
  pol.grad_clip = 0.5;
  expect_steps_allocate_nothing(pol);
}

// The host tier is the CPU backend's second arena: ops run on it and it is measured as planned
// (the disk tier, which only transfers reach, is tests/runtime/transfer_engine_test.cpp's).
TEST(Executor, RunsTheHostTierAsItsOwnArena) {
  Program p;
  TensorDesc d;
  d.name = "host.state";
  d.shape = Shape{16};
  d.tier = Tier::host;
  d.lifetime = Lifetime::persistent;
  const TensorId id = p.add_tensor(d);
  p.begin_section(SectionKind::micro);
  Op fill;
  fill.kind = OpKind::fill;
  fill.name = "host.fill";
  fill.outputs = {id};
  fill.modes = {WriteMode::overwrite};
  fill.attrs = FillAttrs{1.5f};
  p.add_op(fill);
  p.end_section();
  auto backend = make_cpu_backend();
  const CompiledProgram c = compile_program(std::move(p), *backend);
  Executor ex(c, *backend);
  ex.run_section(SectionKind::micro, StepContext{});
  std::vector<float> values(16);
  ex.read_as<float>(c.program.find_tensor("host.state"), values);
  EXPECT_EQ(values, std::vector<float>(16, 1.5f));
  EXPECT_EQ(ex.buffer(Tier::host).measured_high_water(), c.plan.tier(Tier::host).peak_bytes);
  EXPECT_EQ(c.plan.tier(Tier::host).peak_bytes, 64u);
}

}  // namespace
}  // namespace memfit
