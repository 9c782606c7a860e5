// The communicator's ring reductions under mpirun (2 and 4 ranks), against a naive reference
// every rank computes from all ranks' inputs (each rank's data is a function of its rank):
// - sums equal, bit for bit, the ring's order of combination (block j summed from rank j + 1
//   round to rank j, each step `received + own`, in fp32, and rounded once at the end), for
//   fp32, bf16 and fp16 data; maxima and int32 sums exactly;
// - sizes below one element per rank, uneven blocks, and blocks of several scratch segments
//   (the scratch holds three segments of 174,762 fp32 values);
// - reduce-scatter in place and out of place (the input then left untouched), and an
//   all-reduce equals reduce-scatter + all-gather bit for bit;
// - several reductions in flight at once complete in any wait order;
// - a 64 MiB reduce-scatter raises the process's peak RSS by less than 4 MiB (OpenMPI's
//   MPI_Ireduce_scatter_block raised it by 128-512 MiB) and memfit code allocates nothing.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "core/half.hpp"
#include "dist/communicator.hpp"
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

// Block j (of p) of an n-element all-reduce starts at j * n / p; of a reduce-scatter, at j * count.
template <class T>
std::vector<T> reference(int64_t n, const std::function<int64_t(int64_t)>& block_of, bool max) {
  const int p = comm().size();
  std::vector<std::vector<T>> in;
  for (int r = 0; r < p; ++r) in.push_back(input<T>(r, n));
  std::vector<T> out(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const int64_t j = block_of(i);
    float acc = widen(in[size_t((j + 1) % p)][size_t(i)]);
    for (int k = 2; k <= p; ++k) {
      const float own = widen(in[size_t((j + k) % p)][size_t(i)]);
      acc = max ? std::max(acc, own) : acc + own;
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
  if (!in_place) EXPECT_TRUE(same_bits(x.data(), before.data(), count * p)) << "the input changed";
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

TEST(RingReduction, SumsFollowTheRingOrderBitForBit) {
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
