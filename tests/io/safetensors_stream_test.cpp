// The streaming forms of the safetensors reader and writer that train/ uses to move weights
// through a bounded buffer: read_f32_range against the reader's whole-tensor read_f32 (the
// oracle, tested on its own), and a writer fed by producers against the same file written
// from pointers, byte for byte. A producer that emits the wrong number of bytes is refused
// and leaves the earlier file in place.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <vector>

#include "core/error.hpp"
#include "core/half.hpp"
#include "io/safetensors.hpp"
#include "io/io_test_util.hpp"

namespace memfit {
namespace {

std::string file_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

struct TwoTensors {
  std::vector<float> a;
  std::vector<bf16_t> b;
  TwoTensors() : a(1000), b(3 * 257) {
    for (size_t i = 0; i < a.size(); ++i) a[i] = float(std::sin(double(i) * 0.1));
    for (size_t i = 0; i < b.size(); ++i) b[i] = narrow<bf16_t>(float(i) * 0.25f - 7.0f);
  }
};

TEST(SafetensorsStream, RangesReadWhatTheWholeReadReads) {
  const TwoTensors t;
  const test::ScratchDir scratch;
  const std::string path = scratch.file("two.safetensors");
  const SafetensorsTensor tensors[] = {{"a", DType::f32, Shape{1000}, t.a.data()},
                                       {"b", DType::bf16, Shape{3, 257}, t.b.data()}};
  write_safetensors(path, tensors);
  const SafetensorsReader r(path);
  std::vector<float> whole(3 * 257);
  r.read_f32("b", Shape{3, 257}, whole.data());
  std::vector<float> part(300);
  r.read_f32_range("b", Shape{3, 257}, 250, part);  // across the first row's end
  for (size_t i = 0; i < part.size(); ++i)
    ASSERT_EQ(std::bit_cast<uint32_t>(part[i]), std::bit_cast<uint32_t>(whole[250 + i])) << i;
  std::vector<float> a_tail(7);
  r.read_f32_range("a", Shape{1000}, 993, a_tail);
  for (size_t i = 0; i < a_tail.size(); ++i) ASSERT_EQ(a_tail[i], t.a[993 + i]) << i;
  std::vector<float> too_many(8);
  EXPECT_THROW(r.read_f32_range("a", Shape{1000}, 993, too_many), Error);
  EXPECT_THROW(r.read_f32_range("a", Shape{1000}, -1, a_tail), Error);
  EXPECT_THROW(r.read_f32_range("a", Shape{999}, 0, a_tail), Error);
}

TEST(SafetensorsStream, ProducersWriteTheSameFileAsPointers) {
  const TwoTensors t;
  const test::ScratchDir scratch;
  const std::string dir = scratch.path().string();
  const SafetensorsTensor plain[] = {{"a", DType::f32, Shape{1000}, t.a.data()},
                                     {"b", DType::bf16, Shape{3, 257}, t.b.data()}};
  write_safetensors(dir + "/plain.safetensors", plain);
  // Pieces of uneven sizes, one of them empty.
  const auto pieces = [](const void* data, size_t bytes) {
    return [data, bytes](const std::function<void(std::span<const std::byte>)>& emit) {
      const auto* p = static_cast<const std::byte*>(data);
      size_t at = 0;
      for (size_t n : {size_t(3), size_t(0), size_t(1001)}) {
        const size_t take = std::min(n, bytes - at);
        emit(std::span<const std::byte>(p + at, take));
        at += take;
      }
      emit(std::span<const std::byte>(p + at, bytes - at));
    };
  };
  const SafetensorsTensor streamed[] = {
      {"a", DType::f32, Shape{1000}, nullptr, pieces(t.a.data(), 4000)},
      {"b", DType::bf16, Shape{3, 257}, nullptr, pieces(t.b.data(), 2 * 3 * 257)}};
  write_safetensors(dir + "/streamed.safetensors", streamed);
  EXPECT_EQ(file_bytes(dir + "/streamed.safetensors"), file_bytes(dir + "/plain.safetensors"));
}

TEST(SafetensorsStream, AProducerOfTheWrongSizeIsRefusedAndTheEarlierFileKept) {
  const TwoTensors t;
  const test::ScratchDir scratch;
  const std::string path = scratch.file("kept.safetensors");
  const SafetensorsTensor first[] = {{"a", DType::f32, Shape{1000}, t.a.data()}};
  write_safetensors(path, first);
  const std::string before = file_bytes(path);
  for (size_t emitted : {size_t(3996), size_t(4004)}) {
    const SafetensorsTensor wrong[] = {
        {"a", DType::f32, Shape{1000}, nullptr,
         [&](const std::function<void(std::span<const std::byte>)>& emit) {
           const std::vector<std::byte> bytes(emitted);
           emit(bytes);
         }}};
    EXPECT_THROW(write_safetensors(path, wrong), Error) << emitted;
    EXPECT_EQ(file_bytes(path), before) << emitted;
  }
}

}  // namespace
}  // namespace memfit
