// Resharded resumes in one process: a world of one at ZeRO stage 1 or 3 has buckets and
// pieces where stage 0 has plain tensors, so resuming a stage-0 checkpoint there takes the
// range-read path (train/checkpoint_reshard.hpp) without mpirun. What is checked:
//  * the manifest's global layout against the rank file's bytes, read independently here
//    (every shard's bytes are the tensor's, every element in exactly one shard);
//  * bad input, one line each, and from a root the next older checkpoint is resumed: shard
//    ranges that overlap or leave a gap, a rank file shorter than its ranges, a checksum
//    mismatch inside a range; a manifest whose ranges pass the file's end;
//  * a format 2 manifest (before layouts) still resumes on its own layout bit for bit, and
//    names the missing layout when asked to reshard;
//  * another precision, optimizer or number of rows per step is refused in one line naming it.
#include <gtest/gtest.h>

#include <xxhash.h>

#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <sstream>

#include <fmt/format.h>

#include "core/error.hpp"
#include "support/run_cli.hpp"
#include "train/checkpoint_tamper.hpp"
#include "train/trainer.hpp"

namespace memfit {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

RunConfig tiny(int64_t steps, int stage = 0) {
  RunConfig c;
  c.steps = steps;
  c.policy.batch = 2;
  c.policy.seq = 16;
  c.policy.zero_stage = stage;
  c.val_fraction = 0;
  c.log_every = 0;
  return c;
}

struct Finished {
  json report;
  std::string log;
};

Finished train(const RunConfig& c) {
  std::ostringstream log;
  Finished r;
  r.report = run_training(c, log);
  r.log = log.str();
  return r;
}

std::vector<float> losses(const json& report, size_t from = 0) {
  std::vector<float> v;
  for (size_t i = from; i < report["loss"]["history"].size(); ++i) v.push_back(report["loss"]["history"][i].get<float>());
  return v;
}

void expect_refused(const RunConfig& c, const std::vector<std::string>& needles) {
  try {
    train(c);
    ADD_FAILURE() << "resumed " << c.resume;
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_EQ(m.find('\n'), std::string::npos) << m;
    for (const std::string& n : needles) EXPECT_NE(m.find(n), std::string::npos) << "expected '" << n << "' in: " << m;
  }
}

// A stage-0 run of 4 steps with checkpoints at 2 and 4, and the uninterrupted stage-3 run.
class Resharded : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = test::temp_dir() + "/reshard-" + ::testing::UnitTest::GetInstance()->current_test_info()->name();
    fs::remove_all(root_);
    RunConfig c = tiny(4);
    c.checkpoint_dir = root_;
    c.checkpoint_every = 2;
    train(c);
    pristine_manifest_ = test::read_bytes(step4() + "/manifest.json");
    pristine_file_ = test::read_bytes(rank_file());
  }
  void TearDown() override { fs::remove_all(root_); }
  std::string step4() const { return root_ + "/step-000004"; }
  std::string rank_file() const { return step4() + "/rank-0-of-1.bin"; }
  void restore() {
    test::write_bytes(step4() + "/manifest.json", pristine_manifest_);
    test::write_bytes(rank_file(), pristine_file_);
  }
  void edit_manifest(const std::function<void(json&)>& edit) {
    json m = json::parse(pristine_manifest_);
    edit(m);
    test::write_bytes(step4() + "/manifest.json", test::sign_manifest(m));
  }
  // Damage refused by name when step-000004 is named; from the root, step 2 resumes and the
  // run continues as the uninterrupted stage-3 run does (bit for bit: one rank reduces alike).
  void check(const std::string& what, const std::function<void()>& damage, const std::vector<std::string>& needles) {
    SCOPED_TRACE(what);
    restore();
    damage();
    RunConfig named = tiny(6, 3);
    named.resume = step4();
    expect_refused(named, needles);
    RunConfig from_root = tiny(6, 3);
    from_root.resume = root_;
    const Finished r = train(from_root);
    EXPECT_NE(r.log.find("resume: skipped step-000004: "), std::string::npos) << r.log;
    EXPECT_NE(r.log.find("resumed from " + root_ + "/step-000002 at step 2"), std::string::npos) << r.log;
    EXPECT_EQ(losses(r.report), losses(whole_stage3(), 2));
  }
  const json& whole_stage3() {
    static const json whole = train(tiny(6, 3)).report;
    return whole;
  }
  std::string root_, pristine_manifest_, pristine_file_;
};

TEST_F(Resharded, TheLayoutDescribesTheRankFileBytes) {
  const json m = json::parse(pristine_manifest_);
  ASSERT_EQ(m["format"], "memfit-checkpoint-3");
  const test::RankFileParts parts = test::split_rank_file(pristine_file_);
  // The rank file's own header lists its tensors back to back after the header: find each
  // global tensor's bytes there and compare them with what its shards point at.
  std::map<std::string, size_t> at;
  size_t offset = pristine_file_.size() - 8 - parts.data.size();
  for (const json& t : parts.header["tensors"]) {
    at[t["name"].get<std::string>()] = offset;
    offset += t["bytes"].get<size_t>();
  }
  int64_t elements = 0;
  for (const json& t : m["tensors"]) {
    const std::string name = t["name"];
    ASSERT_TRUE(at.count(name)) << name;
    ASSERT_EQ(t["shards"].size(), 1u) << name;
    const json& s = t["shards"][0];
    int64_t numel = 1;
    for (const json& d : t["shape"]) numel *= d.get<int64_t>();
    EXPECT_EQ(s[0], 0);
    EXPECT_EQ(s[1], 0);
    EXPECT_EQ(s[2], numel) << name;
    EXPECT_EQ(s[3].get<size_t>(), at[name]) << name;
    elements += numel;
  }
  EXPECT_EQ(m["tensors"].size(), parts.header["tensors"].size());
  EXPECT_EQ(elements * 4, int64_t(parts.data.size())) << "fp32 AdamW: values, m and v of every parameter";
  // Chunk checksums: 1 MiB of the file each, recomputed here with libxxhash.
  const std::string chunks = m["ranks"][0]["chunks"];
  const size_t chunk = m["ranks"][0]["chunk_bytes"], body = pristine_file_.size() - 8;
  ASSERT_EQ(chunks.size(), 16 * ((body + chunk - 1) / chunk));
  for (size_t k = 0; k * chunk < body; ++k)
    EXPECT_EQ(chunks.substr(16 * k, 16),
              fmt::format("{:016x}", XXH3_64bits(pristine_file_.data() + k * chunk, std::min(chunk, body - k * chunk))));
}

TEST_F(Resharded, BadInputIsRefusedInOneLineAndAnOlderCheckpointTried) {
  const std::string file = "rank-0-of-1.bin";
  check("overlapping shards", [&] {
    edit_manifest([](json& m) {
      json& s = m["tensors"][1]["shards"];
      const int64_t n = s[0][2];
      s[0][2] = n - 4;
      s.push_back({0, n - 8, 8, s[0][3].get<int64_t>() + 4 * (n - 8)});
    });
  }, {"manifest.json", "tensors[1].shards[1]", "overlapping shards"});
  check("a gap between shards", [&] {
    edit_manifest([](json& m) {
      json& s = m["tensors"][1]["shards"];
      const int64_t n = s[0][2];
      s[0][2] = 4;
      s.push_back({0, 8, n - 8, s[0][3].get<int64_t>() + 32});
    });
  }, {"manifest.json", "tensors[1].shards[1]", "elements [4, 8)", "a gap"});
  check("a gap at the end", [&] {
    edit_manifest([](json& m) { m["tensors"][2]["shards"][0][2] = m["tensors"][2]["shards"][0][2].get<int64_t>() - 1; });
  }, {"manifest.json", "tensors[2].shards", "a gap"});
  check("a range past the file's end", [&] {
    edit_manifest([](json& m) { m["tensors"][0]["shards"][0][3] = m["ranks"][0]["bytes"].get<int64_t>(); });
  }, {"manifest.json", "tensors[0].shards[0]", "reaches byte"});
  check("a rank file shorter than its ranges", [&] {
    test::write_bytes(rank_file(), pristine_file_.substr(0, pristine_file_.size() / 2));
  }, {file, "shorter than its ranges", "truncated"});
  check("a checksum mismatch in a range", [&] {
    std::string b = pristine_file_;
    b[b.size() - 1000] ^= 0x20;  // inside the last tensor's bytes, in the last chunk
    test::write_bytes(rank_file(), b);
  }, {file, "checksum mismatch in bytes [", "(damaged)"});
  check("a missing rank file", [&] { fs::remove(rank_file()); }, {file, "cannot open"});
}

TEST_F(Resharded, AFormat2CheckpointResumesOnItsOwnLayoutOnly) {
  // Step 4 as the previous memfit wrote it: no layout, no chunk checksums, no rows.
  edit_manifest([](json& m) {
    m["format"] = "memfit-checkpoint-2";
    m.erase("tensors");
    m["loader"].erase("rows_per_batch");
    m["loader"].erase("shuffle");
    for (json& r : m["ranks"]) r.erase("chunk_bytes"), r.erase("chunks");
  });
  const json whole = train(tiny(6)).report;
  RunConfig same = tiny(6);
  same.resume = step4();
  EXPECT_EQ(losses(train(same).report), losses(whole, 4));
  RunConfig other = tiny(6, 3);
  other.resume = step4();
  expect_refused(other, {"without a global layout", "ZeRO stage 0", "stage 3"});
}

TEST_F(Resharded, AnotherKindOfRunIsRefusedNamingTheDifference) {
  RunConfig bf16 = tiny(6, 3);
  bf16.policy.precision = Precision::bf16;
  bf16.resume = root_;
  expect_refused(bf16, {"step-000004", "precision fp32", "bf16"});
  RunConfig q8 = tiny(6, 1);
  q8.policy.optimizer = OptimizerKind::adamw8bit;
  q8.resume = root_;
  expect_refused(q8, {"step-000004", "adamw state", "adamw8bit"});
  RunConfig rows = tiny(6, 3);
  rows.policy.batch = 1;  // 1 row per step where the checkpoint read 2
  rows.resume = root_;
  expect_refused(rows, {"step-000004", "2 rows per step", "this run reads 1", "--grad-accum"});
  // The same rows per step in another shape resume: 1 row x 2 micro-steps.
  RunConfig accum = tiny(6, 1);
  accum.policy.batch = 1;
  accum.policy.grad_accum = 2;
  accum.resume = root_;
  EXPECT_NE(train(accum).log.find("resumed from " + step4() + " at step 4"), std::string::npos);
}

}  // namespace
}  // namespace memfit
