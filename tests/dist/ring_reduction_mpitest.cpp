// The communicator's reductions under mpirun (2 and 4 ranks), against a naive reference every
// rank computes from all ranks' inputs (each rank's data is a function of its rank):
// - sums equal, bit for bit, the order of combination in fp32, rounded once at the end, for
//   fp32, bf16 and fp16 data; maxima and int32 sums exactly. Power-of-two worlds: every block
//   the pairwise tree over rank order, ((x0 + x1) + (x2 + x3)) + ..., the lower ranks' partial
//   on the left; other worlds the ring's (block j from rank j + 1 round to rank j, each step
//   `received + own`). The ring forced on a power-of-two world follows the ring's order;
// - sizes below one element per rank, uneven blocks, and blocks of several scratch segments
//   (the scratch holds three segments of 174,762 fp32 values);
// - reduce-scatter in place and out of place (the input then left untouched), and an
//   all-reduce equals reduce-scatter + all-gather bit for bit;
// - several reductions in flight at once complete in any wait order;
// - a 64 MiB reduce-scatter raises the process's peak RSS by less than 4 MiB (OpenMPI's
//   MPI_Ireduce_scatter_block raised it by 128-512 MiB) and memfit code allocates nothing.
// With MEMFIT_RING_BENCH=1, times halving against the ring on 64 MiB (fp32 and bf16), both
// through a 2 MiB scratch, alternating, and prints the medians.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "core/half.hpp"
#include "dist/communicator.hpp"
#include "dist/mpi_ring.hpp"
#include "support/alloc_counter.hpp"

namespace memfit {
namespace {

Communicator& comm() {
  static std::unique_ptr<Communicator> c = make_mpi_communicator();
  return *c;
}

// Rank r's i-th input: varied magnitudes so that the order of additions shows in the bits.
float value(int r, int64_t i) {
  const uint64_t h = (uint64_t(i) * 2654435761u + uint64_t(r) * 40503u) % 1000003u;
  return (float(h) / 1000003.0f - 0.5f) * float(1 << (h % 13));
}

template <class T>
std::vector<T> input(int r, int64_t n) {
  std::vector<T> x(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) x[size_t(i)] = narrow<T>(value(r, i));
  return x;
}

bool power_of_two(int p) { return (p & (p - 1)) == 0; }

float op(float a, float b, bool max) { return max ? (a > b ? a : b) : a + b; }

// The pairwise tree over ranks [lo, hi) of element i.
template <class T>
float tree(const std::vector<std::vector<T>>& in, int lo, int hi, int64_t i, bool max) {
  if (hi - lo == 1) return widen(in[size_t(lo)][size_t(i)]);
  const int mid = (lo + hi) / 2;
  return op(tree(in, lo, mid, i, max), tree(in, mid, hi, i, max), max);
}

// Block j (of p) of an n-element all-reduce starts at j * n / p; of a reduce-scatter, at j * count.
template <class T>
std::vector<T> reference(int64_t n, const std::function<int64_t(int64_t)>& block_of, bool max, bool ring = false) {
  const int p = comm().size();
  std::vector<std::vector<T>> in;
  for (int r = 0; r < p; ++r) in.push_back(input<T>(r, n));
  std::vector<T> out(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const int64_t j = block_of(i);
    float acc = 0;
    if (power_of_two(p) && !ring) {
      acc = tree(in, 0, p, i, max);
    } else {
      acc = widen(in[size_t((j + 1) % p)][size_t(i)]);
      for (int k = 2; k <= p; ++k) acc = op(acc, widen(in[size_t((j + k) % p)][size_t(i)]), max);
    }
    out[size_t(i)] = narrow<T>(acc);
  }
  return out;
}

template <class T>
bool same_bits(const T* a, const T* b, int64_t n) {
  return std::memcmp(a, b, size_t(n) * sizeof(T)) == 0;
}

template <class T>
void check_all_reduce(DType dt, int64_t n, ReduceOp op) {
  const int p = comm().size();
  std::vector<T> x = input<T>(comm().rank(), n);
  comm().all_reduce(x.data(), n, dt, op);
  const auto want = reference<T>(n, [&](int64_t i) {
    int64_t j = 0;
    while ((j + 1) * n / p <= i) ++j;
    return j;
  }, op == ReduceOp::max);
  EXPECT_TRUE(same_bits(x.data(), want.data(), n)) << dtype_name(dt) << " n " << n;
}

template <class T>
void check_reduce_scatter(DType dt, int64_t count, bool in_place) {
  const int p = comm().size(), r = comm().rank();
  std::vector<T> x = input<T>(r, count * p);
  const std::vector<T> before = x;
  std::vector<T> out(static_cast<size_t>(count));
  if (in_place) comm().reduce_scatter(x.data(), x.data(), count, dt, ReduceOp::sum);
  else comm().reduce_scatter(x.data(), out.data(), count, dt, ReduceOp::sum);
  const auto want = reference<T>(count * p, [&](int64_t i) { return i / count; }, false);
  const T* got = in_place ? x.data() : out.data();
  EXPECT_TRUE(same_bits(got, want.data() + r * count, count)) << dtype_name(dt) << " count " << count;
  if (!in_place) {
    EXPECT_TRUE(same_bits(x.data(), before.data(), count * p)) << "the input changed";
  }
}

// Runs one reduction through RingReduction directly, polling as the communicator's wait does.
void reduce_directly(const RingReduction::Spec& spec, std::vector<std::byte>& scratch) {
  RingReduction r;
  r.prepare(spec, MPI_COMM_WORLD, comm().rank(), comm().size(), scratch.data(), int64_t(scratch.size()));
  r.start();
  for (uint32_t polls = 0; !r.advance(); ++polls)
    if (polls > 2048) usleep(20);
}

int64_t peak_rss_kib() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("VmHWM:", 0) == 0) return std::stoll(line.substr(6));
  return -1;
}

// First: the process's peak RSS is then the test's own buffers, so a temporary shows.
TEST(RingReduction, ALargeReduceScatterAddsNoProcessMemory) {
  const int p = comm().size();
  const int64_t count = (int64_t(64) << 20) / 4 / p;
  std::vector<float> x(size_t(count * p), 1.0f), out(size_t(count), 0.0f);
  comm().barrier();
  const int64_t before = peak_rss_kib();
  test::alloc_counter_start();
  const CommTicket t = comm().start_reduce_scatter(x.data(), out.data(), count, DType::f32, ReduceOp::sum);
  comm().wait(t);
  EXPECT_EQ(test::alloc_counter_stop().memfit_allocations, 0);
  EXPECT_LT(peak_rss_kib() - before, 4 * 1024) << "KiB added to the peak RSS by a 64 MiB reduce-scatter";
  EXPECT_EQ(out[0], float(p));
  EXPECT_EQ(comm().resident_bytes(), uint64_t(2) << 20);
}

TEST(RingReduction, SumsFollowTheirOrderBitForBit) {
  ASSERT_GE(comm().size(), 2) << "run under mpirun with several ranks";
  for (int64_t n : {int64_t(1), int64_t(3), int64_t(1000), int64_t(1234567)}) {
    check_all_reduce<float>(DType::f32, n, ReduceOp::sum);
    check_all_reduce<bf16_t>(DType::bf16, n, ReduceOp::sum);
    check_all_reduce<fp16_t>(DType::f16, n, ReduceOp::sum);
    check_all_reduce<float>(DType::f32, n, ReduceOp::max);
  }
  std::vector<int32_t> m = {comm().rank(), -comm().rank(), 1};
  comm().all_reduce(m.data(), 3, DType::i32, ReduceOp::max);
  EXPECT_EQ(m, (std::vector<int32_t>{comm().size() - 1, 0, 1}));
  comm().all_reduce(m.data(), 3, DType::i32, ReduceOp::sum);
  EXPECT_EQ(m[2], comm().size());
}

TEST(RingReduction, ReduceScatterInPlaceAndOutOfPlace) {
  for (int64_t count : {int64_t(1), int64_t(777), int64_t(700001)})
    for (bool in_place : {false, true}) {
      check_reduce_scatter<float>(DType::f32, count, in_place);
      check_reduce_scatter<bf16_t>(DType::bf16, count, in_place);
    }
}

TEST(RingReduction, AllReduceEqualsReduceScatterThenAllGather) {
  const int p = comm().size(), r = comm().rank();
  const int64_t count = 300007;
  std::vector<float> a = input<float>(r, count * p), b = a, shard(static_cast<size_t>(count));
  comm().all_reduce(a.data(), count * p, DType::f32, ReduceOp::sum);
  comm().reduce_scatter(b.data(), shard.data(), count, DType::f32, ReduceOp::sum);
  comm().all_gather(shard.data(), b.data(), count, DType::f32);
  EXPECT_TRUE(same_bits(a.data(), b.data(), count * p));
}

// The ring forced on any world (the benchmark's other side) keeps the ring's order.
TEST(RingReduction, TheForcedRingFollowsTheRingOrder) {
  const int p = comm().size(), r = comm().rank();
  std::vector<std::byte> scratch(size_t(2) << 20);
  for (int64_t count : {int64_t(5), int64_t(400003)}) {
    std::vector<bf16_t> x = input<bf16_t>(r, count * p), out(static_cast<size_t>(count));
    comm().barrier();
    reduce_directly({RingReduction::Kind::reduce_scatter, x.data(), out.data(), count, DType::bf16, ReduceOp::sum,
                     true},
                    scratch);
    const auto want = reference<bf16_t>(count * p, [&](int64_t i) { return i / count; }, false, true);
    EXPECT_TRUE(same_bits(out.data(), want.data() + r * count, count)) << "count " << count;
  }
}

TEST(RingReduction, Benchmark) {
  if (!std::getenv("MEMFIT_RING_BENCH")) GTEST_SKIP() << "MEMFIT_RING_BENCH=1 times halving against the ring";
  const int p = comm().size();
  std::vector<std::byte> scratch(size_t(2) << 20);
  const int64_t bytes = int64_t(64) << 20;
  for (DType dt : {DType::f32, DType::bf16})
    for (auto kind : {RingReduction::Kind::all_reduce, RingReduction::Kind::reduce_scatter}) {
      const int64_t n = bytes / int64_t(dtype_bytes(dt, 1));
      std::vector<std::byte> data(size_t(bytes), std::byte{0}), out(size_t(bytes / p), std::byte{0});
      const bool all = kind == RingReduction::Kind::all_reduce;
      std::vector<double> ms[2];
      for (int trial = 0; trial < 12; ++trial)
        for (int ring = 0; ring < 2; ++ring) {
          comm().barrier();
          const auto t0 = std::chrono::steady_clock::now();
          reduce_directly({kind, data.data(), all ? data.data() : out.data(), all ? n : n / p, dt, ReduceOp::sum,
                           ring == 1},
                          scratch);
          comm().barrier();
          ms[ring].push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
        }
      for (auto& v : ms) std::sort(v.begin(), v.end());
      if (comm().rank() == 0)
        std::printf("bench %d ranks, 64 MiB %s %s: halving %.1f ms, ring %.1f ms (medians of 12), ring/halving %.2f\n",
                    p, std::string(dtype_name(dt)).c_str(), all ? "all-reduce" : "reduce-scatter", ms[0][6], ms[1][6],
                    ms[1][6] / ms[0][6]);
    }
}

TEST(RingReduction, SeveralInFlightCompleteInAnyWaitOrder) {
  const int r = comm().rank();
  const int64_t n = 600000;
  std::vector<float> a = input<float>(r, n), b = input<float>(r + 7, n), want_a = a, want_b = b;
  comm().all_reduce(want_a.data(), n, DType::f32, ReduceOp::sum);
  comm().all_reduce(want_b.data(), n, DType::f32, ReduceOp::sum);
  const CommTicket ta = comm().start_all_reduce(a.data(), n, DType::f32, ReduceOp::sum);
  const CommTicket tb = comm().start_all_reduce(b.data(), n, DType::f32, ReduceOp::sum);
  // Rank 0 waits for the later one first.
  if (r == 0) {
    comm().wait(tb);
    comm().wait(ta);
  } else {
    comm().wait(ta);
    comm().wait(tb);
  }
  EXPECT_TRUE(same_bits(a.data(), want_a.data(), n));
  EXPECT_TRUE(same_bits(b.data(), want_b.data(), n));
}

}  // namespace
}  // namespace memfit

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  memfit::comm();  // MPI up before any test
  return RUN_ALL_TESTS();
}
