// The manifest parser on its own: what format_checkpoint_manifest writes parses back field for
// field; every tampering (a wrong type, a non-integer, an out-of-range or inconsistent value,
// an edit without a matching checksum, an unknown or missing field, garbage) is refused with
// one line naming the field. Checksums are recomputed here with libxxhash directly, so that a
// mutation reaches the field check behind the checksum.
#include <gtest/gtest.h>
#include <xxhash.h>

#include <string>

#include <nlohmann/json.hpp>

#include "core/error.hpp"
#include "io/token_file.hpp"
#include "train/checkpoint_manifest.hpp"
#include "train/data_loader.hpp"

namespace memfit {
namespace {

using json = nlohmann::json;

CheckpointManifest sample() {
  CheckpointManifest m;
  m.step = 7;
  m.applied = 6;
  m.total_steps = 20;
  m.model = "gpt2-tiny";
  m.model_spec = {{"name", "gpt2-tiny"}, {"n_layer", 4}, {"n_embd", 128}};
  m.world_size = 2;
  m.zero_stage = 1;
  m.precision = Precision::fp16;
  m.optimizer = OptimizerKind::adamw8bit;
  m.schedule.kind = LrScheduleKind::cosine;
  m.schedule.lr = 1e-3;
  m.schedule.warmup = 2;
  m.schedule.min_lr = 1e-4;
  m.schedule.decay_steps = 20;
  m.batches_per_epoch = 5;
  m.batches_per_step = 2;
  m.loader_epoch = 2;  // 14 batches over epochs of 5: the 14th is batch 4 of epoch 2
  m.loader_cursor = 4;
  m.loss_scaler = LossScaler::State{32768.0, 3, 1, 2};
  m.ranks = {{"rank-0-of-2.bin", 1000, 0x0123456789abcdefull}, {"rank-1-of-2.bin", 1001, 0xfedcba9876543210ull}};
  return m;
}

// Re-signs an edited manifest as the writer would (XXH3 of the compact JSON without "checksum").
std::string signed_text(json j) {
  j.erase("checksum");
  const std::string body = j.dump();
  j["checksum"] = fmt::format("xxh3:{:016x}", XXH3_64bits(body.data(), body.size()));
  return j.dump(2);
}

void expect_refused(const std::string& text, const std::string& field, const std::string& what = "") {
  try {
    parse_checkpoint_manifest(text);
    ADD_FAILURE() << "accepted a manifest with a bad '" << field << "'";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_EQ(m.rfind("[checkpoint] ", 0), 0u) << m;
    EXPECT_NE(m.find("'" + field + "'"), std::string::npos) << "expected field '" << field << "' in: " << m;
    if (!what.empty()) {
      EXPECT_NE(m.find(what), std::string::npos) << "expected '" << what << "' in: " << m;
    }
    EXPECT_EQ(m.find('\n'), std::string::npos) << m;
  }
}

TEST(CheckpointManifest, WhatIsWrittenParsesBackFieldForField) {
  const CheckpointManifest m = sample();
  const CheckpointManifest r = parse_checkpoint_manifest(format_checkpoint_manifest(m));
  EXPECT_EQ(r.step, m.step);
  EXPECT_EQ(r.applied, m.applied);
  EXPECT_EQ(r.total_steps, m.total_steps);
  EXPECT_EQ(r.model, m.model);
  EXPECT_EQ(r.model_spec, m.model_spec);
  EXPECT_EQ(r.world_size, m.world_size);
  EXPECT_EQ(r.zero_stage, m.zero_stage);
  EXPECT_EQ(r.precision, m.precision);
  EXPECT_EQ(r.optimizer, m.optimizer);
  EXPECT_EQ(r.schedule.kind, m.schedule.kind);
  EXPECT_EQ(r.schedule.lr, m.schedule.lr);
  EXPECT_EQ(r.schedule.decay_steps, m.schedule.decay_steps);
  EXPECT_EQ(r.schedule.min_lr, m.schedule.min_lr);
  EXPECT_EQ(r.loader_epoch, m.loader_epoch);
  EXPECT_EQ(r.loader_cursor, m.loader_cursor);
  ASSERT_TRUE(r.loss_scaler);
  EXPECT_EQ(r.loss_scaler->scale, 32768.0);
  EXPECT_EQ(r.loss_scaler->hysteresis, 2);
  ASSERT_EQ(r.ranks.size(), 2u);
  EXPECT_EQ(r.ranks[1].file, "rank-1-of-2.bin");
  EXPECT_EQ(r.ranks[1].bytes, 1001u);
  EXPECT_EQ(r.ranks[1].xxh3, 0xfedcba9876543210ull);
  // The test's own signing agrees with the writer's: an unedited manifest re-signed is accepted.
  EXPECT_NO_THROW(parse_checkpoint_manifest(signed_text(json::parse(format_checkpoint_manifest(m)))));
}

TEST(CheckpointManifest, EveryTamperedFieldIsRefusedByName) {
  const json good = json::parse(format_checkpoint_manifest(sample()));
  auto edited = [&](auto edit) {
    json j = good;
    edit(j);
    return signed_text(j);
  };
  expect_refused(edited([](json& j) { j["world_size"] = 1.5; }), "world_size", "integer");
  expect_refused(edited([](json& j) { j["world_size"] = "2"; }), "world_size", "integer");
  expect_refused(edited([](json& j) { j["world_size"] = 0; }), "world_size");
  expect_refused(edited([](json& j) { j["zero_stage"] = 4; }), "zero_stage");
  expect_refused(edited([](json& j) { j["step"] = 0; }), "step");
  expect_refused(edited([](json& j) { j["step"] = -3; }), "step");
  expect_refused(edited([](json& j) { j["step"] = 7.0; }), "step", "integer");
  expect_refused(edited([](json& j) { j["step"] = 18446744073709551615ull; }), "step");
  expect_refused(edited([](json& j) { j["applied"] = 8; }), "applied");
  expect_refused(edited([](json& j) { j["total_steps"] = 6; }), "step");
  expect_refused(edited([](json& j) { j["loader"]["epoch"] = int64_t(1) << 62; }), "loader.epoch");
  expect_refused(edited([](json& j) { j["loader"]["epoch"] = 3; }), "loader.epoch", "end in epoch 2");
  expect_refused(edited([](json& j) { j["loader"]["cursor"] = 5; }), "loader.cursor");
  expect_refused(edited([](json& j) { j["loader"]["batches_per_epoch"] = 0; }), "loader.batches_per_epoch");
  expect_refused(edited([](json& j) { j["loss_scaler"]["scale"] = -1; }), "loss_scaler.scale");
  expect_refused(edited([](json& j) { j["loss_scaler"]["scale"] = 0; }), "loss_scaler.scale");
  expect_refused(edited([](json& j) { j["loss_scaler"]["hysteresis"] = 0; }), "loss_scaler.hysteresis");
  expect_refused(edited([](json& j) { j["loss_scaler"]["skipped"] = 8; }), "loss_scaler.skipped");
  expect_refused(edited([](json& j) { j["loss_scaler"] = "big"; }), "loss_scaler");
  expect_refused(edited([](json& j) { j["precision"] = "fp8"; }), "precision");
  expect_refused(edited([](json& j) { j["optimizer"] = "sgd"; }), "optimizer");
  expect_refused(edited([](json& j) { j["lr_schedule"]["min_lr"] = 1.0; }), "lr_schedule");
  expect_refused(edited([](json& j) { j["lr_schedule"]["decay_steps"] = 1.5; }), "lr_schedule.decay_steps");
  expect_refused(edited([](json& j) { j["ranks"].erase(1); }), "ranks", "1 rank files for a world of 2");
  expect_refused(edited([](json& j) { j["ranks"][1]["file"] = "../../etc/passwd"; }), "ranks[1].file");
  expect_refused(edited([](json& j) { std::swap(j["ranks"][0], j["ranks"][1]); }), "ranks[0].file");
  expect_refused(edited([](json& j) { j["ranks"][0]["xxh3"] = "123"; }), "ranks[0].xxh3");
  expect_refused(edited([](json& j) { j["ranks"][0]["bytes"] = -1; }), "ranks[0].bytes");
  expect_refused(edited([](json& j) { j["model_spec"]["n_layer"] = json::array({4}); }), "model_spec.n_layer");
  expect_refused(edited([](json& j) { j["model"] = ""; }), "model");
  expect_refused(edited([](json& j) { j["format"] = "memfit-checkpoint-1"; }), "format");
  expect_refused(edited([](json& j) { j["extra"] = 1; }), "extra", "not a field");
  expect_refused(edited([](json& j) { j["loader"]["extra"] = 1; }), "loader.extra");
  expect_refused(edited([](json& j) { j.erase("applied"); }), "applied", "missing");
  expect_refused(edited([](json& j) { j.erase("loader"); }), "loader", "missing");
}

TEST(CheckpointManifest, AnEditWithoutAMatchingChecksumIsRefused) {
  json j = json::parse(format_checkpoint_manifest(sample()));
  j["step"] = 8;  // plausible, in range: only the checksum tells
  expect_refused(j.dump(2), "checksum", "edited or damaged");
  j = json::parse(format_checkpoint_manifest(sample()));
  j["checksum"] = "xxh3:00000000000000zz";
  expect_refused(j.dump(2), "checksum");
  j.erase("checksum");
  expect_refused(j.dump(2), "checksum", "missing");
}

TEST(CheckpointManifest, GarbageIsRefusedWithoutACrash) {
  for (const std::string& text : {std::string(""), std::string("{"), std::string("[]"), std::string("null"),
                                 std::string("{\"format\": 1e999}"), std::string(200000, '['),
                                 std::string("\x00\xff", 2)}) {
    EXPECT_THROW(parse_checkpoint_manifest(text), Error) << text.substr(0, 20);
  }
  std::string nested = "{\"format\":\"memfit-checkpoint-2\",\"model_spec\":";
  for (int i = 0; i < 10000; ++i) nested += "{\"a\":";
  EXPECT_THROW(parse_checkpoint_manifest(nested), Error);
}

// The data position the manifest checks against is the one BatchLoader really reports.
TEST(CheckpointManifest, LoaderPositionMatchesTheBatchLoader) {
  std::vector<uint16_t> tokens(5 * 8 + 1);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = uint16_t(i % 50);
  const TokenData data = TokenData::from_tokens(tokens, "test tokens");
  BatchLoader loader(data, 0, data.size(), 2, 4, 50, true, 3, "training");
  ASSERT_EQ(loader.batches_per_epoch(), 5);
  std::vector<int32_t> x(8), y(8);
  for (int64_t n = 0; n <= 23; ++n) {
    const auto [epoch, cursor] = loader_position_after(n, loader.batches_per_epoch());
    EXPECT_EQ(epoch, loader.epoch()) << n << " batches";
    EXPECT_EQ(cursor, loader.cursor()) << n << " batches";
    loader.next(x.data(), y.data());
  }
}

}  // namespace
}  // namespace memfit
