// The leak guard on real steps of gpt2-tiny.
//   * Poisoning every dead buffer with NaN after its last op changes nothing: losses and every
//     persistent tensor are bitwise those of an unpoisoned run (without and with gradient
//     accumulation, whose loop-carried buffers must not be poisoned between micro-steps).
//   * It catches what it is for: a plan whose interval for one tensor ends too early (the
//     attention probabilities, read again in backward) turns the loss into NaN and the guard
//     fails with a [leak] error; a stray byte written into dead memory is found between steps.
//   * Resident memory is flat: 1,000 bare steps with the guard after 10 warm-up steps grow RSS
//     by exactly 0 bytes (the CLI soak in tests/cli/leak_soak_test.cpp runs the trainer).
//   * A buffer that enters a repeated section from before it is poisoned only after the last
//     iteration (a hand-built program: fill X once, then accumulate X into Y three times).
#include <gtest/gtest.h>

#include <omp.h>

#include <cstring>

#include "core/error.hpp"
#include "runtime/compile.hpp"
#include "runtime/leak_guard.hpp"
#include "support/tiny_run.hpp"
#include "support/tensor_values.hpp"

namespace memfit {
namespace {

using test::TinyRun;

void expect_poison_changes_nothing(const Policy& pol) {
  TinyRun guarded(pol), plain(pol);
  LeakGuard guard(*guarded.ex, 1);
  for (int s = 1; s <= 3; ++s) {
    guard.before_step();
    guarded.step(s);
    guard.after_step(s, guarded.loss());
    plain.step(s);
    const float a = guarded.loss(), b = plain.loss();
    ASSERT_EQ(std::memcmp(&a, &b, sizeof(float)), 0) << "step " << s << ": " << a << " vs " << b;
  }
  const Program& p = guarded.compiled.program;
  for (size_t id = 0; id < p.tensors().size(); ++id) {
    const TensorDesc& t = p.tensors()[id];
    if (t.lifetime != Lifetime::persistent || t.is_view() || t.name == "library.scratch") continue;
    EXPECT_EQ(test::tensor_bytes(*guarded.ex, TensorId(id)), test::tensor_bytes(*plain.ex, TensorId(id))) << t.name;
  }
  EXPECT_GT(guard.report().poisoned_bytes, 0u);
  EXPECT_EQ(guard.report().steps_checked, 3);
}

TEST(LeakGuard, PoisonedRunIsBitwiseEqual) {
  Policy pol;
  pol.batch = 4;
  pol.seq = 64;
  expect_poison_changes_nothing(pol);
}

TEST(LeakGuard, PoisonedRunIsBitwiseEqualWithAccumulation) {
  Policy pol;
  pol.batch = 2;
  pol.seq = 32;
  pol.grad_accum = 3;
  expect_poison_changes_nothing(pol);
}

TEST(LeakGuard, CatchesAnIntervalThatEndsTooEarly) {
  Policy pol;
  pol.batch = 2;
  pol.seq = 32;
  CompiledProgram c = test::compile_tiny(pol);
  // Pretend the planner ended the interval of layer 0's attention probabilities at the
  // forward op that makes them; attention backward still reads them.
  const TensorId probs = c.program.find_tensor("h.0.attn.core.probs");
  ASSERT_NE(probs, kNoTensor);
  TensorPlacement& pl = c.plan.tensors[size_t(probs)];
  const int true_last = pl.live.last;
  pl.live.last = pl.live.first;
  ASSERT_LT(pl.live.last, true_last);
  TinyRun run(std::move(c));
  LeakGuard guard(*run.ex, 1);
  try {
    for (int s = 1; s <= 3; ++s) {
      guard.before_step();
      run.step(s);
      guard.after_step(s, run.loss());
    }
    FAIL() << "the guard did not notice a read after the interval";
  } catch (const Error& e) {
    EXPECT_EQ(e.piece(), "leak");
    EXPECT_NE(std::string(e.what()).find("after its planned interval"), std::string::npos) << e.what();
  }
}

TEST(LeakGuard, FindsAStrayWriteIntoDeadMemory) {
  Policy pol;
  pol.batch = 2;
  pol.seq = 32;
  TinyRun run(pol);
  LeakGuard guard(*run.ex, 1);
  guard.before_step();
  run.step(1);
  guard.after_step(1, run.loss());
  // A kernel writing past its output would leave a byte like this in memory no tensor owns.
  const TensorId logits = run.compiled.program.find_tensor("classifier.logits_chunk");
  const std::byte stray{0x12};
  const auto poke = [&] { run.ex->write(logits, 3, std::span<const std::byte>(&stray, 1)); };
  poke();
  guard.before_step();
  run.step(2);  // the byte survives unless a later buffer takes it over: poke again after the step
  poke();
  try {
    guard.after_step(2, run.loss());
    FAIL() << "the stray byte was not found";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("0x12"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("classifier.logits_chunk"), std::string::npos) << e.what();
  }
}

TEST(LeakGuard, ResidentMemoryIsFlatOverAThousandSteps) {
  // One kernel thread, so that 1,000 steps stay fast when tests share the cores.
  const int threads = omp_get_max_threads();
  omp_set_num_threads(1);
  Policy pol;
  pol.batch = 1;
  pol.seq = 16;
  TinyRun run(pol);
  LeakGuard guard(*run.ex, 10);
  for (int s = 1; s <= 1010; ++s) {
    guard.before_step();
    run.step(s);
    guard.after_step(s, run.loss());
  }
  const LeakReport& r = guard.report();
  std::printf("RSS after warm-up %llu bytes; growth over 1,000 steps: %llu bytes (inside steps %llu)\n",
              (unsigned long long)r.rss_after_warmup, (unsigned long long)r.rss_growth,
              (unsigned long long)r.rss_growth_in_steps);
  EXPECT_GT(r.rss_after_warmup, 0u);
  EXPECT_EQ(r.rss_growth, 0u);
  EXPECT_EQ(r.rss_growth_in_steps, 0u);
  EXPECT_EQ(r.steps_checked, 1010);
  omp_set_num_threads(threads);
}

TEST(LeakGuard, KeepsBuffersThatEnterALoopUntilItsLastIteration) {
  Program p;
  TensorDesc x;
  x.name = "x";
  x.shape = Shape{64};
  const TensorId xid = p.add_tensor(x);
  TensorDesc y = x;
  y.name = "y";
  y.lifetime = Lifetime::persistent;
  const TensorId yid = p.add_tensor(y);
  p.begin_section(SectionKind::eval);  // kinds mean nothing to the planner
  Op fill;
  fill.kind = OpKind::fill;
  fill.name = "fill_x";
  fill.outputs = {xid};
  fill.modes = {WriteMode::overwrite};
  fill.attrs = FillAttrs{1.5f};
  p.add_op(fill);
  p.end_section();
  p.begin_section(SectionKind::micro, 3);
  Op acc;
  acc.kind = OpKind::accumulate;
  acc.name = "y_plus_x";
  acc.inputs = {xid};
  acc.outputs = {yid};
  acc.modes = {WriteMode::accumulate_after_first_micro};
  p.add_op(acc);
  Op acc2 = acc;
  acc2.name = "y_plus_x_again";
  acc2.modes = {WriteMode::accumulate};
  p.add_op(acc2);
  p.end_section();
  auto backend = make_cpu_backend();
  const CompiledProgram c = compile_program(std::move(p), *backend);
  ASSERT_EQ(c.plan.tensors[size_t(xid)].live.last, 2);  // the loop's last op
  Executor ex(c, *backend);
  DeadBufferFill poison(ex, DeadBufferFill::kPoison);
  ex.add_observer(&poison);
  StepContext ctx;
  ctx.micro_count = 3;
  ex.run_section(SectionKind::eval, ctx);
  for (ctx.micro = 0; ctx.micro < 3; ++ctx.micro) ex.run_section(SectionKind::micro, ctx);
  const std::vector<float> out = test::tensor_values<float>(ex, yid);
  for (int i = 0; i < 64; ++i) ASSERT_EQ(out[size_t(i)], 1.5f * 6) << i;  // x + x, then 2x more per micro-step
  EXPECT_EQ(poison.filled_bytes(), 64u * 4);                      // x, once, after the last iteration
  EXPECT_TRUE(poison.find_stray_bytes().empty()) << poison.find_stray_bytes();
}

}  // namespace
}  // namespace memfit
