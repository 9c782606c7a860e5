// The MPI communicator under mpirun (CTest runs this with 2 and 4 ranks): every collective
// against values each rank can compute in closed form, in fp32, bf16 (integers small enough
// to be exact) and int32, blocking and overlapped (also waiting against a timeout), and with no
// allocation by memfit code; the data and tensor groups split from the world (data 2 x tensor
// 2 at 4 ranks, data 1 x tensor 2 at 2) against closed forms over their members; and a wait
// that times out naming the rank that did not arrive.
#include <gtest/gtest.h>

#include <bit>
#include <chrono>
#include <numeric>
#include <thread>
#include <vector>

#include "core/error.hpp"
#include "dist/communicator.hpp"
#include "graph/training_program.hpp"
#include "kernels/backend.hpp"
#include "runtime/collective_op.hpp"
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

// 16-bit reductions round like the kernels (core/half.hpp): bf16 results that fall below the
// smallest normal (2^-126) are flushed to a signed zero, as vcvtneps2bf16 and oneDNN do;
// rounding is to nearest even; fp16 keeps its subnormals (F16C's rule). The expected bit
// patterns come from the formats' definitions, not from the codec.
TEST(MpiCommunicator, SixteenBitReductionsRoundLikeTheKernels) {
  const int n = comm().size();
  // n x 2^-133 (bf16 0x0001, an fp32 subnormal) stays below 2^-126 for n < 128: flushed.
  std::vector<uint16_t> b = {0x0001, 0x8001, uint16_t(0x3F80)};  // 2^-133, -2^-133, 1.0
  comm().all_reduce(b.data(), int64_t(b.size()), DType::bf16, ReduceOp::sum);
  EXPECT_EQ(b[0], 0x0000u);
  EXPECT_EQ(b[1], 0x8000u);
  EXPECT_EQ(from_bf16(b[2]), float(n));
  std::vector<uint16_t> m = {0x0002};
  comm().all_reduce(m.data(), 1, DType::bf16, ReduceOp::max);
  EXPECT_EQ(m[0], 0x0000u);  // the max of subnormals is subnormal: flushed too
  // fp16: n x 2^-24 (0x0001) is the subnormal n x 2^-24, exactly.
  std::vector<uint16_t> h = {0x0001};
  comm().all_reduce(h.data(), 1, DType::f16, ReduceOp::sum);
  EXPECT_EQ(h[0], uint16_t(n));
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
  comm().set_timeout(120);  // waits poll against a deadline: still nothing allocated
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
  comm().set_timeout(0);
}

// Rank r of data D x tensor T: tensor rank t = r % T, data rank d = r / T. Its data group is
// the world ranks d' T + t (d' < D), its tensor group d T + t' (t' < T).
TEST(MpiCommunicator, DataAndTensorGroupsSplitFromTheWorld) {
  const int r = comm().rank(), n = comm().size();
  ASSERT_EQ(n % 2, 0);
  const Topology topo{.data = n / 2, .tensor = 2, .rank = r};
  const int D = topo.data, T = topo.tensor, d = topo.data_rank(), t = topo.tensor_rank();
  const CommGroups groups(comm(), topo);
  Communicator& data = groups[CommGroup::data];
  Communicator& tensor = groups[CommGroup::tensor];
  EXPECT_EQ(&groups[CommGroup::world], &comm());
  ASSERT_EQ(data.size(), D);
  ASSERT_EQ(data.rank(), d);
  ASSERT_EQ(tensor.size(), T);
  ASSERT_EQ(tensor.rank(), t);
  for (int q = 0; q < D; ++q) EXPECT_EQ(data.world_rank(q), q * T + t);
  for (int q = 0; q < T; ++q) EXPECT_EQ(tensor.world_rank(q), d * T + q);
  if (T == n) { EXPECT_EQ(&tensor, &comm()); }  // a group spanning the world is the world

  // all_reduce of (world rank + 1): sums of the members' values.
  float x = float(r + 1);
  data.all_reduce(&x, 1, DType::f32, ReduceOp::sum);
  EXPECT_EQ(x, float(T * D * (D - 1) / 2 + D * (t + 1)));
  int32_t y = r + 1;
  tensor.all_reduce(&y, 1, DType::i32, ReduceOp::sum);
  EXPECT_EQ(y, T * (d * T + 1) + T * (T - 1) / 2);
  int32_t m = r;
  tensor.all_reduce(&m, 1, DType::i32, ReduceOp::max);
  EXPECT_EQ(m, d * T + T - 1);

  // all_gather: member q's block holds member q's world rank.
  const int64_t block = 5;
  std::vector<int32_t> mine(block, r), gathered(size_t(block * D), -1);
  data.all_gather(mine.data(), gathered.data(), block, DType::i32);
  for (int q = 0; q < D; ++q)
    for (int64_t i = 0; i < block; ++i) ASSERT_EQ(gathered[size_t(q * block + i)], q * T + t);

  // reduce_scatter over the tensor group: member q gets sum over members m of
  // (q * block + i + 1000 * world rank of m).
  std::vector<float> full(size_t(block * T)), shard(static_cast<size_t>(block));
  for (int64_t i = 0; i < block * T; ++i) full[size_t(i)] = float(i) + 1000.0f * float(r);
  tensor.reduce_scatter(full.data(), shard.data(), block, DType::f32, ReduceOp::sum);
  const float ranks = float(T * d * T + T * (T - 1) / 2);
  for (int64_t i = 0; i < block; ++i)
    ASSERT_EQ(shard[size_t(i)], float(T) * float(t * block + i) + 1000.0f * ranks) << i;
  comm().barrier();
}

// One rank arrives 1.5 s late at a collective of a group with a 0.5 s timeout: the member that
// waited throws [dist] naming the collective, the group and the late rank's world rank. The
// late rank then completes the collective against the reporter's pending request.
// qgZ's all-to-all over the data group and, with nodes of 2 ranks, over the node and
// across_nodes groups (member d % 2 and d / 2; with 2 ranks both are the data group): block q of
// a member's send goes to member q, whose receive holds it at the sender's index. Starting and
// waiting allocate nothing in memfit code.
TEST(MpiCommunicator, AllToAllOverTheDataNodeAndAcrossNodeGroups) {
  const int r = comm().rank(), n = comm().size();
  Topology topo{.data = n, .rank = r};
  topo.ranks_per_node = 2;
  const CommGroups groups(comm(), topo);
  const int h = topo.data_per_node();
  for (CommGroup g : {CommGroup::data, CommGroup::node, CommGroup::across_nodes}) {
    SCOPED_TRACE(comm_group_name(g));
    Communicator& c = groups[g];
    const int size = c.size(), me = c.rank();
    const int expect_size = g == CommGroup::data || h >= n ? n : g == CommGroup::node ? h : n / h;
    ASSERT_EQ(size, expect_size);
    const int64_t block = 3;
    std::vector<uint8_t> send(size_t(block * size)), recv(size_t(block * size), 0xFF);
    for (int q = 0; q < size; ++q)
      for (int64_t i = 0; i < block; ++i) send[size_t(q * block + i)] = uint8_t(16 * r + 4 * q + i);
    test::alloc_counter_start();
    const CommTicket t = c.start_all_to_all(send.data(), recv.data(), block, DType::u8);
    c.wait(t);
    EXPECT_EQ(test::alloc_counter_stop().memfit_allocations, 0);
    for (int q = 0; q < size; ++q)
      for (int64_t i = 0; i < block; ++i)
        ASSERT_EQ(recv[size_t(q * block + i)], uint8_t(16 * c.world_rank(q) + 4 * me + i)) << q << " " << i;
  }
}

// Given the program, only the groups its collectives run over are split (each split holds the
// transport's scratch for the whole run): plain stage 3 on "nodes" of 2 splits nothing, qgZ's
// program (4 ranks: two hops) splits node and across_nodes, hpZ over the node's 2 ranks reuses
// the node group.
TEST(MpiCommunicator, OnlyTheGroupsAProgramRunsOverAreSplit) {
  const int r = comm().rank(), n = comm().size();
  Topology topo{.data = n, .rank = r};
  topo.ranks_per_node = 2;
  Policy pol;
  pol.batch = 1;
  pol.seq = 16;
  pol.zero_stage = 3;
  auto distinct = [&](const Policy& p, int hpz) {
    const Program program = build_training_program(model_preset("gpt2-tiny"), p, topo, cpu_capabilities());
    return CommGroups(comm(), topo, hpz, &program).distinct_count();
  };
  // The world (also the data group) and the tensor group of one rank.
  EXPECT_EQ(distinct(pol, 1), 2);
  Policy qgz = pol;
  qgz.zero_quantized_gradients = true;
  EXPECT_EQ(distinct(qgz, 1), n >= 4 ? 4 : 2);
  if (n >= 4) {
    Policy both = qgz;
    both.zero_hpz_partition_size = 2;
    EXPECT_EQ(distinct(both, 2), 4);  // hpz is the node group
    Policy hpz = pol;
    hpz.zero_hpz_partition_size = 2;
    EXPECT_EQ(distinct(hpz, 2), 3);
  }
}

TEST(MpiCommunicator, ATimedOutWaitNamesTheRankThatDidNotArrive) {
  const int r = comm().rank(), n = comm().size();
  const int late = n - 1;
  // At 4 ranks the group {1, 3} (color r % 2, a data group); at 2, both ranks.
  std::unique_ptr<Communicator> group = comm().split(n >= 4 ? r % 2 : 0, r);
  group->set_name("data");
  group->set_timeout(0.5);
  const bool member = n < 4 || r % 2 == 1;
  const int reporter = n >= 4 ? 1 : 0;
  int32_t v = 1;
  if (member) {
    if (r == late) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1500));
      group->label_next("late.all_reduce");
      group->all_reduce(&v, 1, DType::i32, ReduceOp::sum);
      EXPECT_EQ(v, 2);
    } else {
      ASSERT_EQ(r, reporter);
      group->label_next("late.all_reduce");
      try {
        group->all_reduce(&v, 1, DType::i32, ReduceOp::sum);
        ADD_FAILURE() << "the wait did not time out";
      } catch (const Error& e) {
        const std::string expected = fmt::format(
            "[dist] collective 'late.all_reduce' (all_reduce #1 on the data group of 2 ranks) did not complete within "
            "0.5 s: rank {} did not arrive",
            late);
        EXPECT_EQ(std::string(e.what()), expected);
      }
    }
  } else {
    group->all_reduce(&v, 1, DType::i32, ReduceOp::sum);  // the other group is on time
    EXPECT_EQ(v, 2);
  }
  comm().barrier();  // progresses the reporter's abandoned request to completion
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
