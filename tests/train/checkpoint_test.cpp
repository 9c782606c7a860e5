// Checkpoints at one rank, through run_training: a resume continues bit for bit (fp16 with its
// loss scaler, a cosine schedule whose horizon is stored); every damaged or edited file is
// refused with one line naming the file and field, and a resume from the root falls back to
// the previous valid checkpoint; an unfinished save is skipped and cleaned up; retention keeps
// the newest; a fresh run never overwrites a root's checkpoints. The last test runs the binary
// under mpirun at 2 ranks: a damaged rank file seen by one rank ends every rank, non-zero,
// within a hard timeout.
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <functional>
#include <sstream>

#include "core/error.hpp"
#include "support/paths.hpp"
#include "support/run_cli.hpp"
#include "train/checkpoint_tamper.hpp"
#include "train/trainer.hpp"

namespace memfit {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

// Checkpoints of gpt2-tiny are ~10 MB each: the process's temporary directory goes at exit.
class RemoveTemporaries : public ::testing::Environment {
  void TearDown() override { fs::remove_all(test::temp_dir()); }
};
const ::testing::Environment* const remove_temporaries = ::testing::AddGlobalTestEnvironment(new RemoveTemporaries);

RunConfig tiny(int64_t steps) {
  RunConfig c;
  c.steps = steps;
  c.policy.batch = 2;
  c.policy.seq = 16;
  c.val_fraction = 0;
  c.lr_schedule = LrScheduleKind::cosine;
  c.warmup_steps = 1;
  return c;
}

std::string fresh_dir(const std::string& name) {
  const std::string d = test::temp_dir() + "/" + name;
  fs::remove_all(d);
  return d;
}

std::vector<float> floats(const json& a, size_t from = 0) {
  std::vector<float> v;
  for (size_t i = from; i < a.size(); ++i) v.push_back(a[i].get<float>());
  return v;
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

// Expects resuming `c` to throw one line naming every needle.
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

TEST(Checkpoint, ResumeContinuesBitForBitWithTheStoredHorizon) {
  RunConfig c = tiny(8);
  c.policy.precision = Precision::fp16;
  const Finished whole = train(c);
  const std::string root = fresh_dir("exact");
  RunConfig saving = c;
  saving.checkpoint_dir = root;
  saving.checkpoint_every = 1;
  saving.keep_checkpoints = 8;
  const Finished saved = train(saving);
  EXPECT_EQ(floats(saved.report["loss"]["history"]), floats(whole.report["loss"]["history"]));

  RunConfig resumed = c;
  resumed.resume = root + "/step-000004";
  const Finished r = train(resumed);
  EXPECT_NE(r.log.find("resumed from " + root + "/step-000004 at step 4"), std::string::npos) << r.log;
  EXPECT_EQ(floats(r.report["loss"]["history"]), floats(whole.report["loss"]["history"], 4));
  EXPECT_EQ(floats(r.report["lr_history"]), floats(whole.report["lr_history"], 4));
  EXPECT_EQ(r.report["loss_scaling"]["history"], json(floats(whole.report["loss_scaling"]["history"], 4)));

  // Longer --steps: the cosine keeps the stored horizon (step 8), so steps 9..12 stay at the
  // floor the uninterrupted run reached at step 8, and the log says so.
  RunConfig longer = c;
  longer.steps = 12;
  longer.resume = root;
  const Finished l = train(longer);
  EXPECT_NE(l.log.find("resumed from " + root + "/step-000008 at step 8"), std::string::npos) << l.log;
  EXPECT_NE(l.log.find("--steps is 12, the checkpoint's run was set to 8"), std::string::npos) << l.log;
  const float floor = whole.report["lr_history"][7].get<float>();
  EXPECT_EQ(floats(l.report["lr_history"]), std::vector<float>(4, floor));
}

// A root with checkpoints at steps 1..3; each mutation of step 3 is undone after its check.
class Tampered : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fresh_dir("tampered");
    RunConfig c = tiny(3);
    c.checkpoint_dir = root_;
    c.checkpoint_every = 1;
    c.keep_checkpoints = 3;
    train(c);
    fs::copy(step3(), root_ + "/pristine", fs::copy_options::recursive);
  }
  std::string step3() const { return root_ + "/step-000003"; }
  std::string rank_file() const { return step3() + "/rank-0-of-1.bin"; }

  // The mutation is refused by name when step 3 is named, and skipped (by name) from the root.
  void check(const std::string& what, const std::function<void()>& mutate, const std::vector<std::string>& needles) {
    SCOPED_TRACE(what);
    mutate();
    RunConfig named = tiny(4);
    named.resume = step3();
    expect_refused(named, needles);
    RunConfig from_root = tiny(4);
    from_root.resume = root_;
    const Finished r = train(from_root);
    EXPECT_NE(r.log.find("resume: skipped step-000003: "), std::string::npos) << r.log;
    for (const std::string& n : needles) EXPECT_NE(r.log.find(n), std::string::npos) << n << " in " << r.log;
    EXPECT_NE(r.log.find("resumed from " + root_ + "/step-000002 at step 2"), std::string::npos) << r.log;
    fs::remove_all(step3());
    fs::copy(root_ + "/pristine", step3(), fs::copy_options::recursive);
  }
  void edit_manifest(const std::function<void(json&)>& edit, bool sign = true) {
    json m = json::parse(test::read_bytes(step3() + "/manifest.json"));
    edit(m);
    test::write_bytes(step3() + "/manifest.json", sign ? test::sign_manifest(m) : m.dump(2));
  }
  void edit_rank_file(const std::function<void(test::RankFileParts&)>& edit) {
    test::RankFileParts parts = test::split_rank_file(test::read_bytes(rank_file()));
    edit(parts);
    test::replace_rank_file_signed(step3(), "rank-0-of-1.bin", test::join_rank_file(parts));
  }
  std::string root_;
};

TEST_F(Tampered, DamagedRankFilesAreRefusedByFileAndField) {
  const std::string file = "rank-0-of-1.bin";
  const std::string bytes = test::read_bytes(rank_file());
  check("truncated", [&] { test::write_bytes(rank_file(), bytes.substr(0, bytes.size() / 2)); }, {file, "truncated"});
  check("trailing bytes", [&] { test::write_bytes(rank_file(), bytes + "xyz"); }, {file, "trailing bytes"});
  check("trailing bytes, re-signed", [&] { edit_rank_file([](auto& p) { p.data += "xyz"; }); },
        {file, "trailing bytes"});
  check("flipped data byte", [&] {
    std::string b = bytes;
    b[b.size() / 2] ^= 0x20;
    test::write_bytes(rank_file(), b);
  }, {file, "checksum mismatch"});
  check("swapped header entries", [&] { edit_rank_file([](auto& p) { std::swap(p.header["tensors"][0], p.header["tensors"][1]); }); },
        {file, "header.tensors[0].name", "out of order"});
  check("duplicate tensor name", [&] {
    edit_rank_file([](auto& p) { p.header["tensors"][1]["name"] = p.header["tensors"][0]["name"]; });
  }, {file, "header.tensors[1].name", "second time"});
  check("header dtype", [&] { edit_rank_file([](auto& p) { p.header["tensors"][2]["dtype"] = "bf16"; }); },
        {file, "header.tensors[2].dtype"});
  check("header step", [&] { edit_rank_file([](auto& p) { p.header["step"] = 2; }); }, {file, "header.step"});
  check("missing rank file", [&] { fs::remove(rank_file()); }, {file, "cannot open"});
  check("bad magic", [&] {
    std::string b = bytes;
    b[0] = 'X';
    test::write_bytes(rank_file(), b);
  }, {file, "not a memfit rank file"});
  check("rank file of another save", [&] { fs::copy_file(root_ + "/step-000002/" + file, rank_file(),
                                                         fs::copy_options::overwrite_existing); },
        {file, "header.step"});
}

TEST_F(Tampered, EditedManifestsAreRefusedByFileAndField) {
  const std::string file = "manifest.json";
  check("non-integer world size", [&] { edit_manifest([](json& m) { m["world_size"] = 1.5; }); }, {file, "'world_size'"});
  check("huge epoch", [&] { edit_manifest([](json& m) { m["loader"]["epoch"] = int64_t(1) << 62; }); },
        {file, "'loader.epoch'"});
  check("negative loss scale", [&] {
    edit_manifest([](json& m) { m["loss_scaler"] = {{"scale", -1}, {"clean", 0}, {"skipped", 0}, {"hysteresis", 1}}; });
  }, {file, "'loss_scaler.scale'"});
  check("edited step, checksum not updated", [&] { edit_manifest([](json& m) { m["step"] = 2; }, false); },
        {file, "'checksum'"});
  check("edited step, re-signed", [&] { edit_manifest([](json& m) { m["step"] = 2; }); }, {file, "'applied'"});
  check("edited step and applied, re-signed", [&] {
    edit_manifest([](json& m) { m["step"] = 2, m["applied"] = 2; });
  }, {file, "'loader.cursor'"});
  check("short ranks list", [&] { edit_manifest([](json& m) { m["ranks"] = json::array(); }); }, {file, "'ranks'"});
  check("missing manifest", [&] { fs::remove(step3() + "/" + file); }, {file, "did not finish"});
  check("truncated manifest", [&] {
    const std::string t = test::read_bytes(step3() + "/" + file);
    test::write_bytes(step3() + "/" + file, t.substr(0, t.size() / 2));
  }, {file, "not valid JSON"});
}

TEST_F(Tampered, ACheckpointOfAnotherKindOfRunStopsWithoutFallingBack) {
  RunConfig other = tiny(4);
  other.policy.precision = Precision::bf16;
  other.resume = root_;
  expect_refused(other, {"step-000003", "precision fp32", "this run uses bf16"});
  RunConfig batch = tiny(4);
  batch.policy.batch = 4;
  batch.resume = root_;
  expect_refused(batch, {"step-000003", "--batch"});
}

// kill -9 between a rank file and the manifest: the unfinished directory is skipped, then
// removed before this run's first save; the run continues bit for bit.
TEST(Checkpoint, AnUnfinishedSaveIsSkippedAndCleanedUp) {
  const Finished whole = train(tiny(5));
  const std::string root = fresh_dir("unfinished");
  RunConfig c = tiny(5);
  c.checkpoint_dir = root;
  c.checkpoint_every = 1;
  c.steps = 3;
  c.decay_steps = 5;  // the uninterrupted run's horizon
  train(c);
  fs::create_directory(root + "/step-000004");
  const std::string half = test::read_bytes(root + "/step-000003/rank-0-of-1.bin");
  test::write_bytes(root + "/step-000004/rank-0-of-1.bin", half.substr(0, half.size() / 3));
  c.steps = 5;
  c.resume = root;
  const Finished r = train(c);
  EXPECT_NE(r.log.find("skipped step-000004: " + root + "/step-000004/manifest.json: missing (its save did not finish)"),
            std::string::npos) << r.log;
  EXPECT_NE(r.log.find("checkpoints: removed step-000004: its save did not finish"), std::string::npos) << r.log;
  EXPECT_EQ(floats(r.report["loss"]["history"]), floats(whole.report["loss"]["history"], 3));
  EXPECT_EQ(test::read_bytes(root + "/latest"), "step-000005\n");
  EXPECT_TRUE(fs::exists(root + "/step-000004/manifest.json"));

  // Killed after the manifest, before `latest` moved: the complete newer one still resumes.
  test::write_bytes(root + "/latest", "step-000004\n");
  RunConfig again = tiny(6);
  again.resume = root;
  EXPECT_NE(train(again).log.find("resumed from " + root + "/step-000005 at step 5"), std::string::npos);
  // `latest` naming nothing is reported, and the scan still finds the newest.
  test::write_bytes(root + "/latest", "step-000099\n");
  const Finished stale = train(again);
  EXPECT_NE(stale.log.find("names step-000099, which does not exist"), std::string::npos) << stale.log;
  EXPECT_NE(stale.log.find("resumed from " + root + "/step-000005 at step 5"), std::string::npos) << stale.log;
}

TEST(Checkpoint, RetentionKeepsTheNewestAndLatestNamesThem) {
  const std::string root = fresh_dir("retention");
  RunConfig c = tiny(5);
  c.checkpoint_dir = root;
  c.checkpoint_every = 1;
  c.keep_checkpoints = 2;
  train(c);
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(root)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"latest", "step-000004", "step-000005"}));
  EXPECT_EQ(test::read_bytes(root + "/latest"), "step-000005\n");
  c.keep_checkpoints = 0;
  EXPECT_THROW(train(c), Error);
  // The config file key sets it too.
  const std::string config = test::temp_dir() + "/keep.json";
  test::write_bytes(config, R"({"keep_checkpoints": 3})");
  RunConfig from_file;
  apply_config_file(config, from_file);
  EXPECT_EQ(from_file.keep_checkpoints, 3);
}

TEST(Checkpoint, AFreshRunNeverOverwritesCheckpoints) {
  const std::string root = fresh_dir("fresh");
  RunConfig c = tiny(2);
  c.checkpoint_dir = root;
  train(c);
  const std::string before = test::read_bytes(root + "/step-000002/rank-0-of-1.bin");
  c.seed = 99;
  expect_refused(c, {root, "already holds checkpoints", "--resume"});
  EXPECT_EQ(test::read_bytes(root + "/step-000002/rank-0-of-1.bin"), before);
}

// Resuming an older checkpoint into its own root abandons the newer ones: they are moved
// aside (never deleted), and the run's own saves take their names.
TEST(Checkpoint, ResumingAnOlderOneSetsTheNewerAside) {
  const std::string root = fresh_dir("older");
  RunConfig c = tiny(4);
  c.checkpoint_dir = root;
  c.checkpoint_every = 1;
  c.keep_checkpoints = 4;
  train(c);
  const std::string old4 = test::read_bytes(root + "/step-000004/manifest.json");
  c.resume = root + "/step-000002";
  c.steps = 3;
  const Finished r = train(c);
  EXPECT_NE(r.log.find("moved step-000004 aside to step-000004.set-aside (newer than the resumed step-000002)"),
            std::string::npos) << r.log;
  EXPECT_EQ(test::read_bytes(root + "/step-000004.set-aside/manifest.json"), old4);
  EXPECT_TRUE(fs::exists(root + "/step-000003.set-aside/manifest.json"));
  EXPECT_TRUE(fs::exists(root + "/step-000003/manifest.json"));
  EXPECT_FALSE(fs::exists(root + "/step-000004"));
  EXPECT_EQ(test::read_bytes(root + "/latest"), "step-000003\n");
}

// Under mpirun, 2 ranks: one rank's file damaged. Every rank prints the same one-line error
// and exits non-zero; `timeout` is the hard limit that a hang would hit (exit 124).
TEST(Checkpoint, ADamagedRankFileOnOneOfTwoRanksEndsEveryRank) {
  const std::string root = fresh_dir("mpi"), log = test::temp_dir() + "/mpi.log";
  auto mpirun = [&](const std::string& args) {
    const std::string cmd = "OMP_NUM_THREADS=1 timeout -k 10 180 mpirun --allow-run-as-root --oversubscribe -np 2 " +
                            test::memfit_binary() + " train --batch 2 --seq 16 --val-fraction 0 " + args + " >" + log +
                            " 2>&1";
    const int raw = std::system(cmd.c_str());
    return std::make_pair(WIFEXITED(raw) ? WEXITSTATUS(raw) : 128, test::read_bytes(log));
  };
  auto [saved, out] = mpirun("--steps 2 --checkpoint-every 1 --checkpoint-dir " + root);
  ASSERT_EQ(saved, 0) << out;
  const std::string victim = root + "/step-000002/rank-1-of-2.bin";
  std::string bytes = test::read_bytes(victim);
  bytes[bytes.size() - 20] ^= 1;
  test::write_bytes(victim, bytes);

  auto [named, named_out] = mpirun("--steps 3 --resume " + root + "/step-000002");
  EXPECT_NE(named, 0) << named_out;
  EXPECT_NE(named, 124) << "timed out: a rank hung\n" << named_out;
  // Every rank throws rank 1's error; the first MPI_Abort may end the other rank before it
  // prints (a loaded machine), so at least one line, and no other error.
  size_t lines = 0, errors = 0;
  for (int rank = 0; rank < 2; ++rank)
    if (named_out.find("memfit: error: [rank " + std::to_string(rank) + "] [checkpoint] " + victim +
                       ": checksum mismatch") != std::string::npos)
      ++lines;
  for (size_t at = named_out.find("memfit: error:"); at != std::string::npos; at = named_out.find("memfit: error:", at + 1))
    ++errors;
  EXPECT_GE(lines, 1u) << "the ranks report rank 1's error:\n" << named_out;
  EXPECT_EQ(errors, lines) << "an error other than rank 1's:\n" << named_out;

  fs::remove(victim);
  auto [fallback, fallback_out] = mpirun("--steps 3 --resume " + root);
  EXPECT_EQ(fallback, 0) << fallback_out;
  EXPECT_NE(fallback_out.find("skipped step-000002: " + victim + ": cannot open"), std::string::npos) << fallback_out;
  EXPECT_NE(fallback_out.find("resumed from " + root + "/step-000001 at step 1"), std::string::npos) << fallback_out;
}

}  // namespace
}  // namespace memfit
