// The MPI communicator under mpirun (CTest runs this with 2 and 4 ranks): every collective
// against values each rank can compute in closed form, in fp32, bf16 (integers small enough
// to be exact) and int32, blocking and overlapped, and with no allocation by memfit code.
#include <gtest/gtest.h>

#include <bit>
#include <numeric>
#include <vector>

#include "dist/communicator.hpp"
#include "support/alloc_counter.hpp"

namespace memfit {
namespace {

Communicator& comm() {
  static std::unique_ptr<Communicator> c = make_mpi_communicator();
  return *c;
}

uint16_t bf16(float f) { return uint16_t(std::bit_cast<uint32_t>(f) >> 16); }  // exact for small integers
float from_bf16(uint16_t h) { return std::bit_cast<float>(uint32_t(h) << 16); }

TEST(MpiCommunicator, AllReduceSumsAndMaxes) {
  const int r = comm().rank(), n = comm().size();
  ASSERT_GE(n, 2) << "run under mpirun with several ranks";
  std::vector<float> x(1000);
  for (size_t i = 0; i < x.size(); ++i) x[i] = float(r + 1) * float(i % 17);
  comm().all_reduce(x.data(), int64_t(x.size()), DType::f32, ReduceOp::sum);
  const float ranks_sum = float(n * (n + 1) / 2);
  for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(x[i], ranks_sum * float(i % 17)) << i;

  std::vector<int32_t> m = {r, -r, 7 * r};
  comm().all_reduce(m.data(), 3, DType::i32, ReduceOp::max);
  EXPECT_EQ(m, (std::vector<int32_t>{n - 1, 0, 7 * (n - 1)}));

  std::vector<uint16_t> h(64);
  for (size_t i = 0; i < h.size(); ++i) h[i] = bf16(float(r) + float(i));
  comm().all_reduce(h.data(), int64_t(h.size()), DType::bf16, ReduceOp::sum);
  for (size_t i = 0; i < h.size(); ++i) ASSERT_EQ(from_bf16(h[i]), float(n * (n - 1) / 2) + float(n) * float(i)) << i;
}

TEST(MpiCommunicator, ReduceScatterAndAllGatherAreInverseShapes) {
  const int r = comm().rank(), n = comm().size();
  const int64_t block = 37;
  std::vector<float> full(size_t(block * n));
  for (int64_t i = 0; i < block * n; ++i) full[size_t(i)] = float(i) + float(r) * 1000.0f;
  std::vector<float> shard(static_cast<size_t>(block));
  comm().reduce_scatter(full.data(), shard.data(), block, DType::f32, ReduceOp::sum);
  const float rank_part = 1000.0f * float(n * (n - 1) / 2);
  for (int64_t i = 0; i < block; ++i) ASSERT_EQ(shard[size_t(i)], float(n) * float(r * block + i) + rank_part) << i;

  std::vector<float> gathered(size_t(block * n), -1.0f);
  comm().all_gather(shard.data(), gathered.data(), block, DType::f32);
  for (int q = 0; q < n; ++q)
    for (int64_t i = 0; i < block; ++i)
      ASSERT_EQ(gathered[size_t(q * block + i)], float(n) * float(q * block + i) + rank_part);

  // In place: each rank's block already sits at its position.
  std::vector<float> inplace(size_t(block * n), 0.0f);
  for (int64_t i = 0; i < block; ++i) inplace[size_t(r * block + i)] = float(r * 10 + i);
  comm().all_gather(inplace.data() + r * block, inplace.data(), block, DType::f32);
  for (int q = 0; q < n; ++q)
    for (int64_t i = 0; i < block; ++i) ASSERT_EQ(inplace[size_t(q * block + i)], float(q * 10 + i));
}

TEST(MpiCommunicator, BroadcastAndOverlappedCollectivesAllocateNothingInMemfit) {
  const int r = comm().rank(), n = comm().size();
  std::vector<float> a(4096, float(r)), b(4096, float(r + 1));
  std::vector<int32_t> c(5, r == n - 1 ? 42 : 0);
  test::alloc_counter_start();
  const CommTicket ta = comm().start_all_reduce(a.data(), 4096, DType::f32, ReduceOp::sum);
  const CommTicket tb = comm().start_all_reduce(b.data(), 4096, DType::f32, ReduceOp::max);
  const CommTicket tc = comm().start_broadcast(c.data(), 5, DType::i32, n - 1);
  comm().wait(tb);
  comm().wait(ta);
  comm().wait(tc);
  comm().barrier();
  const test::AllocCounts counts = test::alloc_counter_stop();
  EXPECT_EQ(counts.memfit_allocations, 0);
  EXPECT_EQ(a[4095], float(n * (n - 1) / 2));
  EXPECT_EQ(b[0], float(n));
  EXPECT_EQ(c, std::vector<int32_t>(5, 42));
}

}  // namespace
}  // namespace memfit

int main(int argc, char** argv) {
  testing::InitGoogleTest(&argc, argv);
  const int rank = memfit::comm().rank();
  if (rank != 0) {  // one report, from rank 0; every rank's failures still fail the run
    auto& listeners = testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
  }
  return RUN_ALL_TESTS();
}
