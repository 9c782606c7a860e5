// train/tensor_staging: fp32 values moved into and out of a 16-bit tensor several staging
// chunks long, at an offset that is not a chunk boundary, checked against an independent
// oracle (round-to-nearest-even on the fp32 bits, written here) and against the bytes outside
// the range, which must not change; zeroing and chunked reads likewise. Each check can fail:
// an off-by-one chunk boundary, a wrong element offset or a stray write shows as a mismatch.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/error.hpp"
#include "runtime/compile.hpp"
#include "support/alloc_counter.hpp"
#include "support/tensor_values.hpp"
#include "train/tensor_staging.hpp"
#include "kernels/backend.hpp"

namespace memfit {
namespace {

// Three chunks and a part of the staging's raw region in bf16 elements.
constexpr int64_t kChunkElements = int64_t(TensorStaging::kElements * sizeof(float) / 2);
constexpr int64_t kN = 3 * kChunkElements + 4321;

struct OneTensor {
  std::unique_ptr<Backend> backend = make_cpu_backend();
  CompiledProgram compiled;
  std::unique_ptr<Executor> ex;
  TensorId w = kNoTensor;

  explicit OneTensor(DType dtype) {
    Program p;
    TensorDesc d;
    d.name = "w";
    d.shape = Shape{kN};
    d.dtype = dtype;
    d.lifetime = Lifetime::persistent;
    w = p.add_tensor(d);
    p.begin_section(SectionKind::eval);
    Op fill;  // never run: it gives the tensor a place in the plan
    fill.kind = OpKind::fill;
    fill.name = "fill_w";
    fill.outputs = {w};
    fill.modes = {WriteMode::overwrite};
    fill.attrs = FillAttrs{0.0f};
    p.add_op(fill);
    p.end_section();
    compiled = compile_program(std::move(p), *backend);
    ex = std::make_unique<Executor>(compiled, *backend);
  }
};

uint16_t bf16_bits_nearest_even(float x) {  // finite x only
  const uint32_t bits = std::bit_cast<uint32_t>(x);
  return uint16_t((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}

std::vector<uint16_t> bf16_elements(const Executor& ex, TensorId id) {
  const std::vector<std::byte> bytes = test::tensor_bytes(ex, id);
  std::vector<uint16_t> out(bytes.size() / 2);
  std::memcpy(out.data(), bytes.data(), bytes.size());
  return out;
}

TEST(TensorStaging, Fp32ValuesRoundIntoABf16TensorAcrossChunksAndReadBackWidened) {
  OneTensor t(DType::bf16);
  TensorStaging staging;
  const std::vector<uint16_t> marks(size_t(kN), 0x3f80);  // 1.0 everywhere: the bytes outside the range
  t.ex->write(t.w, std::as_bytes(std::span<const uint16_t>(marks)));
  const int64_t first = 777, n = kN - first - 99;  // neither end on a chunk boundary
  std::vector<float> values(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) values[size_t(i)] = float(std::sin(double(i) * 0.013) * 1000.0 + 0.3);
  write_fp32(*t.ex, t.w, first, values, staging.raw());

  const std::vector<uint16_t> stored = bf16_elements(*t.ex, t.w);
  for (int64_t i = 0; i < kN; ++i) {
    const bool inside = i >= first && i < first + n;
    const uint16_t expected = inside ? bf16_bits_nearest_even(values[size_t(i - first)]) : uint16_t(0x3f80);
    ASSERT_EQ(stored[size_t(i)], expected) << "element " << i;
  }
  std::vector<float> back(static_cast<size_t>(n));
  read_fp32(*t.ex, t.w, first, back, staging.raw());
  for (int64_t i = 0; i < n; ++i)
    ASSERT_EQ(std::bit_cast<uint32_t>(back[size_t(i)]), uint32_t(stored[size_t(first + i)]) << 16) << i;
}

TEST(TensorStaging, Fp32TensorsAreCopiedExactlyWithoutAllocating) {
  OneTensor t(DType::f32);
  TensorStaging staging;
  std::vector<float> values(size_t(kN) - 10), back(values.size());
  for (size_t i = 0; i < values.size(); ++i) values[i] = float(i) * 0.5f - 3.0f;
  test::alloc_counter_start();
  write_fp32(*t.ex, t.w, 10, values, staging.raw());
  read_fp32(*t.ex, t.w, 10, back, staging.raw());
  EXPECT_EQ(test::alloc_counter_stop().memfit_allocations, 0);
  EXPECT_EQ(back, values);
  EXPECT_EQ(test::tensor_values<float>(*t.ex, t.w)[10 + 12345], values[12345]);
}

TEST(TensorStaging, ZeroingTouchesOnlyItsRangeAndChunksVisitEveryByteInOrder) {
  OneTensor t(DType::bf16);
  TensorStaging staging;
  const std::vector<uint16_t> marks(size_t(kN), 0xabcd);
  t.ex->write(t.w, std::as_bytes(std::span<const uint16_t>(marks)));
  const uint64_t from = 2 * 1001, bytes = 2 * uint64_t(kN) - from - 6;
  zero_bytes(*t.ex, t.w, from, bytes, staging.raw());
  const std::vector<uint16_t> stored = bf16_elements(*t.ex, t.w);
  for (int64_t i = 0; i < kN; ++i) {
    const bool zeroed = uint64_t(2 * i) >= from && uint64_t(2 * i) < from + bytes;
    ASSERT_EQ(stored[size_t(i)], zeroed ? 0 : 0xabcd) << i;
  }
  std::vector<std::byte> seen;
  uint64_t expected_offset = 0;
  for_each_chunk(*t.ex, t.w, 2 * uint64_t(kN), staging.raw(), [&](uint64_t at, std::span<const std::byte> chunk) {
    EXPECT_EQ(at, expected_offset);
    EXPECT_LE(chunk.size(), staging.raw().size());
    expected_offset += chunk.size();
    seen.insert(seen.end(), chunk.begin(), chunk.end());
  });
  EXPECT_EQ(seen, test::tensor_bytes(*t.ex, t.w));
}

TEST(TensorStaging, RangesOutsideTheTensorAreRefused) {
  OneTensor t(DType::bf16);
  TensorStaging staging;
  std::vector<float> two(2);
  EXPECT_THROW(write_fp32(*t.ex, t.w, kN - 1, two, staging.raw()), Error);
  EXPECT_THROW(read_fp32(*t.ex, t.w, kN - 1, two, staging.raw()), Error);
}

}  // namespace
}  // namespace memfit
