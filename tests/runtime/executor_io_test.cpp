// Executor::read/write against the tensor's planned bytes seen directly in the arena (the
// oracle): a write lands exactly at the planned offset and nowhere else, a read returns what
// is there, a span of the wrong size or an unplaced tensor is refused, and neither allocates.
// The ranged forms move exactly bytes [offset, offset + size) of the tensor and refuse a range
// reaching past it; read_scalar returns a one-element tensor's value.
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

TEST(ExecutorIo, RangedReadsAndWritesMoveOnlyTheirBytes) {
  Policy pol;
  pol.batch = 2;
  pol.seq = 32;
  test::TinyRun run(pol);
  const Program& p = run.compiled.program;
  const TensorId wte = p.find_tensor("wte.weight");
  ASSERT_NE(wte, kNoTensor);
  const TensorPlacement& pl = run.compiled.plan.tensors[size_t(wte)];
  const Arena& arena = run.ex->arena(pl.tier);
  std::vector<std::byte> expected(arena.data(), arena.data() + arena.size());
  const uint64_t offset = 4 * 1000 + 2;  // not element-aligned: bytes are bytes
  std::vector<std::byte> piece(333);
  for (size_t i = 0; i < piece.size(); ++i) piece[i] = std::byte(i * 7 + 1);
  std::vector<std::byte> back(piece.size());
  test::alloc_counter_start();
  run.ex->write(wte, offset, piece);
  run.ex->read(wte, offset, back);
  EXPECT_EQ(test::alloc_counter_stop().memfit_allocations, 0);
  EXPECT_EQ(back, piece);
  std::memcpy(expected.data() + pl.offset + offset, piece.data(), piece.size());
  EXPECT_EQ(std::memcmp(expected.data(), arena.data(), arena.size()), 0);

  // Elements: read_as with an element offset reads what the byte form wrote.
  const float values[3] = {1.5f, -2.0f, 7.25f};
  float got[3] = {};
  run.ex->write_as<float>(wte, 17, std::span<const float>(values));
  run.ex->read(wte, 17 * sizeof(float), std::as_writable_bytes(std::span<float>(got)));
  EXPECT_EQ(std::memcmp(got, values, sizeof values), 0);

  const uint64_t bytes = pl.bytes;
  std::byte one{};
  EXPECT_NO_THROW(run.ex->read(wte, bytes - 1, std::span<std::byte>(&one, 1)));
  EXPECT_THROW(run.ex->read(wte, bytes, std::span<std::byte>(&one, 1)), Error);
  EXPECT_THROW(run.ex->write(wte, bytes - 1, std::span<const std::byte>(piece).first(2)), Error);
  EXPECT_THROW(run.ex->read(wte, ~uint64_t(0), std::span<std::byte>(&one, 1)), Error);  // no wrap-around
}

TEST(ExecutorIo, ReadScalarReturnsTheValueAndRefusesALargerTensor) {
  Policy pol;
  pol.batch = 2;
  pol.seq = 32;
  test::TinyRun run(pol);
  const Program& p = run.compiled.program;
  const TensorId loss = p.find_tensor(kLoss);
  const float value = -0.125f;
  run.ex->write_as<float>(loss, std::span<const float>(&value, 1));
  test::alloc_counter_start();
  const float got = run.ex->read_scalar<float>(loss);
  EXPECT_EQ(test::alloc_counter_stop().memfit_allocations, 0);
  EXPECT_EQ(got, value);
  EXPECT_THROW((void)run.ex->read_scalar<float>(p.find_tensor("wte.weight")), Error);
}

}  // namespace
}  // namespace memfit
