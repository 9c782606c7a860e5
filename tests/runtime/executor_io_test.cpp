// Executor::read/write against the tensor's planned bytes seen directly in the arena (the
// oracle): a write lands exactly at the planned offset and nowhere else, a read returns what
// is there, a span of the wrong size or an unplaced tensor is refused, and neither allocates.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "core/error.hpp"
#include "graph/training_program.hpp"
#include "runtime/executor.hpp"
#include "support/alloc_counter.hpp"
#include "support/tiny_run.hpp"

namespace memfit {
namespace {

TEST(ExecutorIo, ReadAndWriteMoveExactlyTheTensorsPlannedBytes) {
  Policy pol;
  pol.batch = 2;
  pol.seq = 32;
  test::TinyRun run(pol);
  const Program& p = run.compiled.program;
  const TensorId loss = p.find_tensor(kLoss);
  ASSERT_NE(loss, kNoTensor);
  const TensorPlacement& pl = run.compiled.plan.tensors[size_t(loss)];
  const Arena& arena = run.ex->arena(pl.tier);
  std::vector<std::byte> before(arena.data(), arena.data() + arena.size());

  const float value = 3.25f;
  float back = 0;
  test::alloc_counter_start();
  run.ex->write_as<float>(loss, std::span<const float>(&value, 1));
  run.ex->read_as<float>(loss, std::span<float>(&back, 1));
  const test::AllocCounts counts = test::alloc_counter_stop();
  EXPECT_EQ(counts.memfit_allocations, 0);
  EXPECT_EQ(back, value);

  std::memcpy(before.data() + pl.offset, &value, sizeof value);  // the one change expected
  EXPECT_EQ(std::memcmp(before.data(), arena.data(), arena.size()), 0);

  double wrong = 0;
  EXPECT_THROW(run.ex->read_as<double>(loss, std::span<double>(&wrong, 1)), Error);
  EXPECT_THROW(run.ex->write(TensorId(p.tensors().size()), {}), Error);
}

}  // namespace
}  // namespace memfit
