// HF checkpoints as they are published: transformers' own sharded save of the tiny Qwen2 model
// (tools/make_sharded_fixture.py) loads and gives PyTorch's loss and gradients; memfit's own
// sharded --save (transformers' split, index last) reads back bit for bit.
#include <gtest/gtest.h>

#include <filesystem>
#include <cstring>

#include <nlohmann/json.hpp>

#include "io/safetensors_shards.hpp"
#include "support/paths.hpp"
#include "support/run_cli.hpp"
#include "support/torch_fixture.hpp"

namespace memfit {
namespace {

namespace fs = std::filesystem;

TEST(ShardedCheckpoint, TransformersShardsGivePyTorchsLossAndGradients) {
  test::TorchFixtureRun run("qwen2_tiny_torch", AttentionKind::plain, test::fixture_path("qwen2_tiny_sharded"));
  test::expect_loss_and_gradients_match(run);
}

TEST(ShardedCheckpoint, TheIndexFileItselfLoadsToo) {
  test::TorchFixtureRun run("qwen2_tiny_torch", AttentionKind::plain,
                            test::fixture_path("qwen2_tiny_sharded/model.safetensors.index.json"));
  test::expect_loss_and_gradients_match(run);
}

TEST(ShardedCheckpoint, ShardedSaveReadsBackBitForBit) {
  const std::string fixture = test::fixture_path("qwen2_tiny_torch");
  const std::string out = test::temp_dir() + "/sharded_save";
  // --steps 1 at lr 0 keeps the weights: the save must hold the fixture's values exactly.
  const auto r = test::run_memfit("train --model " + fixture + "/config.json --load " + fixture +
                                  " --steps 1 --lr 0 --batch 2 --seq 32 --val-fraction 0 --save " + out +
                                  " --max-shard-size 40KB");
  ASSERT_EQ(r.status, 0) << r.err;
  ASSERT_TRUE(fs::exists(out + "/model.safetensors.index.json"));
  EXPECT_FALSE(fs::exists(out + "/model.safetensors"));
  const SafetensorsShards saved(out), original(fixture);
  EXPECT_GT(saved.shard_count(), 2u);
  for (const auto& e : fs::directory_iterator(out))
    if (e.path().string().ends_with(".safetensors")) {
      const SafetensorsReader shard(e.path().string());
      uint64_t data = 0;
      for (const SafetensorsEntry& t : shard.entries()) data += t.bytes();
      EXPECT_TRUE(data <= 40'000 || shard.entries().size() == 1) << e.path() << " holds " << data << " bytes";
    }
  ASSERT_EQ(saved.tensors().size(), original.tensors().size());
  for (const SafetensorsShards::Located& o : original.tensors()) {
    const SafetensorsShards::Located* s = saved.find(o.entry->name);
    ASSERT_NE(s, nullptr) << o.entry->name;
    ASSERT_EQ(s->entry->bytes(), o.entry->bytes()) << o.entry->name;
    EXPECT_EQ(std::memcmp(s->shard->data(*s->entry), o.shard->data(*o.entry), o.entry->bytes()), 0) << o.entry->name;
  }
}

}  // namespace
}  // namespace memfit
