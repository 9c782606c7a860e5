// Sharded safetensors: the writer splits as transformers does and the reader finds every tensor
// again; damaged indexes and shard sets fail with one line naming the problem. The check against
// transformers' own sharded files is tests/train/sharded_checkpoint_test.cpp.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <numeric>

#include <nlohmann/json.hpp>

#include "io/safetensors_shards.hpp"
#include "io/io_test_util.hpp"

namespace memfit {
namespace {

using test::expect_error;
using test::ScratchDir;
using test::write_bytes;

struct Model {
  std::vector<std::vector<float>> values;
  std::vector<SafetensorsTensor> tensors;
};

// Tensors of 100, 300, 50, 400 and 20 floats whose values say which tensor and element they are;
// odd tensors produce their bytes in two pieces, as a streaming save does.
Model make_model() {
  Model m;
  const std::vector<int64_t> sizes = {100, 300, 50, 400, 20};
  m.values.reserve(sizes.size());
  for (size_t i = 0; i < sizes.size(); ++i) {
    auto& v = m.values.emplace_back(size_t(sizes[i]));
    for (size_t k = 0; k < v.size(); ++k) v[k] = float(i * 1000 + k);
    SafetensorsTensor t{"layer." + std::to_string(i) + ".weight", DType::f32, Shape{sizes[i]}, v.data()};
    if (i % 2 == 1) {
      const std::span<const std::byte> bytes = std::as_bytes(std::span<const float>(v));
      t.data = nullptr;
      t.produce = [bytes](const std::function<void(std::span<const std::byte>)>& emit) {
        emit(bytes.first(bytes.size() / 2));
        emit(bytes.subspan(bytes.size() / 2));
      };
    }
    m.tensors.push_back(t);
  }
  return m;
}

void expect_reads_back(const SafetensorsShards& set, const Model& m) {
  ASSERT_EQ(set.tensors().size(), m.tensors.size());
  for (size_t i = 0; i < m.tensors.size(); ++i) {
    const SafetensorsShards::Located* t = set.find(m.tensors[i].name);
    ASSERT_NE(t, nullptr) << m.tensors[i].name;
    std::vector<float> got(m.values[i].size());
    t->shard->read_f32(t->entry->name, m.tensors[i].shape, got.data());
    EXPECT_EQ(got, m.values[i]) << m.tensors[i].name;
    set.release(*t);
  }
}

TEST(SafetensorsShards, SplitsInOrderAsTransformersDoesAndReadsBack) {
  ScratchDir dir;
  const Model m = make_model();
  // 1600 bytes per shard: [100 + 300] = 1600, [50] (400 would overflow), [400], [20].
  const auto files = write_safetensors_shards(dir.path().string(), m.tensors, 1600);
  const std::vector<std::string> expected = {"model-00001-of-00004.safetensors", "model-00002-of-00004.safetensors",
                                             "model-00003-of-00004.safetensors", "model-00004-of-00004.safetensors",
                                             std::string(kSafetensorsIndexName)};
  EXPECT_EQ(files, expected);
  const auto index = nlohmann::json::parse(test::read_bytes(dir.file(std::string(kSafetensorsIndexName))));
  EXPECT_EQ(index["metadata"]["total_size"].get<uint64_t>(), 870u * 4);
  EXPECT_EQ(index["weight_map"]["layer.1.weight"], "model-00001-of-00004.safetensors");
  EXPECT_EQ(index["weight_map"]["layer.2.weight"], "model-00002-of-00004.safetensors");
  EXPECT_EQ(index["weight_map"]["layer.3.weight"], "model-00003-of-00004.safetensors");
  const SafetensorsShards set(dir.path().string());
  EXPECT_EQ(set.shard_count(), 4u);
  expect_reads_back(set, m);
  // The index file itself opens the same set.
  expect_reads_back(SafetensorsShards(dir.file(std::string(kSafetensorsIndexName))), m);
}

TEST(SafetensorsShards, ATensorLargerThanTheLimitGetsAShardOfItsOwn) {
  ScratchDir dir;
  const Model m = make_model();
  const auto files = write_safetensors_shards(dir.path().string(), m.tensors, 1000);
  // [100] [300] [50] [400] [20]: 300 and 400 floats exceed 1000 bytes alone; 50 + 400 would too.
  EXPECT_EQ(files.size(), 6u);
  expect_reads_back(SafetensorsShards(dir.path().string()), m);
}

TEST(SafetensorsShards, ASaveThatFitsIsOneFileAndReplacesAnEarlierShardedSave) {
  ScratchDir dir;
  const Model m = make_model();
  write_safetensors_shards(dir.path().string(), m.tensors, 1600);
  write_bytes(dir.file("notes.txt"), "the user's own file");
  const auto files = write_safetensors_shards(dir.path().string(), m.tensors, parse_shard_size("5GB"));
  EXPECT_EQ(files, std::vector<std::string>{std::string(kSingleSafetensorsName)});
  std::vector<std::string> present;
  for (const auto& e : std::filesystem::directory_iterator(dir.path())) present.push_back(e.path().filename().string());
  std::sort(present.begin(), present.end());
  EXPECT_EQ(present, (std::vector<std::string>{"model.safetensors", "notes.txt"}));
  expect_reads_back(SafetensorsShards(dir.path().string()), m);
  // And back to shards: the single file goes once the index is written.
  write_safetensors_shards(dir.path().string(), m.tensors, 1600);
  EXPECT_FALSE(std::filesystem::exists(dir.file("model.safetensors")));
  expect_reads_back(SafetensorsShards(dir.path().string()), m);
}

TEST(SafetensorsShards, ParsesShardSizesAsTransformersDoes) {
  EXPECT_EQ(parse_shard_size("5GB"), 5'000'000'000u);
  EXPECT_EQ(parse_shard_size("500MB"), 500'000'000u);
  EXPECT_EQ(parse_shard_size("2GiB"), uint64_t(2) << 30);
  EXPECT_EQ(parse_shard_size("100kb"), 100'000u);
  EXPECT_EQ(parse_shard_size("4096"), 4096u);
  expect_error([] { parse_shard_size("5 GB"); }, "safetensors", {"5 GB", "unit"});
  expect_error([] { parse_shard_size("GB"); }, "safetensors", {"whole number"});
  expect_error([] { parse_shard_size("0MB"); }, "safetensors", {"more than zero"});
  expect_error([] { parse_shard_size("5TB"); }, "safetensors", {"unknown unit"});
}

class DamagedShards : public ::testing::Test {
 protected:
  void SetUp() override {
    const Model m = make_model();
    write_safetensors_shards(dir.path().string(), m.tensors, 1600);
    index = nlohmann::json::parse(test::read_bytes(index_path()));
  }
  std::string index_path() const { return dir.file(std::string(kSafetensorsIndexName)); }
  void rewrite_index() { write_bytes(index_path(), index.dump()); }
  ScratchDir dir;
  nlohmann::json index;
};

TEST_F(DamagedShards, CorruptIndex) {
  write_bytes(index_path(), "{\"weight_map\": {\"a\": ");
  expect_error([&] { SafetensorsShards s(dir.path().string()); }, "safetensors", {kSafetensorsIndexName, "not valid JSON"});
  write_bytes(index_path(), "{\"metadata\": {}}");
  expect_error([&] { SafetensorsShards s(dir.path().string()); }, "safetensors", {"weight_map"});
}

TEST_F(DamagedShards, MissingShard) {
  std::filesystem::remove(dir.file("model-00003-of-00004.safetensors"));
  expect_error([&] { SafetensorsShards s(dir.path().string()); }, "safetensors",
               {"model-00003-of-00004.safetensors", "missing"});
}

TEST_F(DamagedShards, TensorInTwoShards) {
  // Shard 4 rewritten to also hold layer.2.weight, which shard 2 holds.
  std::vector<float> a(20, 1.0f), b(50, 2.0f);
  const std::vector<SafetensorsTensor> both = {{"layer.4.weight", DType::f32, Shape{20}, a.data()},
                                               {"layer.2.weight", DType::f32, Shape{50}, b.data()}};
  write_safetensors(dir.file("model-00004-of-00004.safetensors"), both);
  expect_error([&] { SafetensorsShards s(dir.path().string()); }, "safetensors", {"layer.2.weight", "two shards"});
}

TEST_F(DamagedShards, IndexAndShardDisagree) {
  index["weight_map"]["layer.9.weight"] = "model-00001-of-00004.safetensors";
  rewrite_index();
  expect_error([&] { SafetensorsShards s(dir.path().string()); }, "safetensors", {"layer.9.weight", "lacks it"});
  SetUp();
  index["weight_map"].erase("layer.0.weight");
  rewrite_index();
  expect_error([&] { SafetensorsShards s(dir.path().string()); }, "safetensors", {"layer.0.weight", "nowhere"});
}

TEST_F(DamagedShards, ShardOutsideTheDirectory) {
  index["weight_map"]["layer.0.weight"] = "../model-00001-of-00004.safetensors";
  rewrite_index();
  expect_error([&] { SafetensorsShards s(dir.path().string()); }, "safetensors", {"not a file name"});
}

TEST_F(DamagedShards, EmptyDirectory) {
  ScratchDir empty;
  expect_error([&] { SafetensorsShards s(empty.path().string()); }, "safetensors", {"holds neither"});
}

}  // namespace
}  // namespace memfit

namespace memfit {
namespace {

// transformers' own sharded save of the tiny Qwen2 model holds, tensor for tensor, the bytes of
// the single-file fixture it was made from.
TEST(SafetensorsShards, ReadsTransformersShardedCheckpoint) {
  const std::string fixtures = MEMFIT_FIXTURE_DIR;
  const SafetensorsShards sharded(fixtures + "/qwen2_tiny_sharded");
  const SafetensorsShards single(fixtures + "/qwen2_tiny_torch");
  EXPECT_EQ(sharded.shard_count(), 4u);
  EXPECT_EQ(single.shard_count(), 1u);
  ASSERT_EQ(sharded.tensors().size(), single.tensors().size());
  for (const SafetensorsShards::Located& s : single.tensors()) {
    const SafetensorsShards::Located* t = sharded.find(s.entry->name);
    ASSERT_NE(t, nullptr) << s.entry->name;
    ASSERT_EQ(t->entry->bytes(), s.entry->bytes()) << s.entry->name;
    EXPECT_EQ(t->entry->shape, s.entry->shape) << s.entry->name;
    EXPECT_EQ(std::memcmp(t->shard->data(*t->entry), s.shard->data(*s.entry), s.entry->bytes()), 0) << s.entry->name;
  }
}

}  // namespace
}  // namespace memfit
