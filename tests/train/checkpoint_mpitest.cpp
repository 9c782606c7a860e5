// Checkpoints over several ranks, in process (mpirun -np 2 and 4): damage that only the last
// rank can see (its own file) is agreed on by every rank. From the root, every rank skips the
// same damaged checkpoints and resumes the same older one, and the run continues bit for bit
// with the uninterrupted one; a named damaged checkpoint, a missing rank file or a short
// `ranks` list makes every rank throw the same error (a hang would hit ctest's timeout).
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <sstream>

#include "core/error.hpp"
#include "train/checkpoint_manifest.hpp"
#include "train/checkpoint_tamper.hpp"
#include "train/trainer.hpp"

namespace memfit {
namespace {

namespace fs = std::filesystem;

Communicator& comm() {
  static std::unique_ptr<Communicator> c = make_mpi_communicator();
  return *c;
}

RunConfig config(int64_t steps) {
  RunConfig c;
  c.policy.precision = Precision::bf16;
  c.policy.zero_stage = 2;
  c.policy.seq = 32;
  c.policy.batch = 2;
  c.steps = steps;
  c.val_fraction = 0.05;
  c.eval_batches = 1;
  c.log_every = 0;
  return c;
}

std::vector<float> losses(const nlohmann::json& report, size_t from = 0) {
  std::vector<float> v;
  for (size_t i = from; i < report["loss"]["history"].size(); ++i) v.push_back(report["loss"]["history"][i].get<float>());
  return v;
}

// Every rank must throw, with the same message, naming every needle.
void expect_every_rank_refuses(const RunConfig& c, const std::vector<std::string>& needles) {
  std::ostringstream log;
  std::string message;
  try {
    run_training(c, log, nullptr, &comm());
    ADD_FAILURE() << "rank " << comm().rank() << " resumed " << c.resume;
  } catch (const Error& e) {
    message = e.what();
  }
  for (const std::string& n : needles) EXPECT_NE(message.find(n), std::string::npos) << "expected '" << n << "' in: " << message;
  // The same message on every rank: compare lengths and checksums through the communicator.
  int32_t mine[2] = {int32_t(message.size()), int32_t(std::hash<std::string>{}(message) & 0x7fffffff)};
  int32_t most[2] = {mine[0], mine[1]};
  comm().all_reduce(most, 2, DType::i32, ReduceOp::max);
  EXPECT_EQ(mine[0], most[0]) << message;
  EXPECT_EQ(mine[1], most[1]) << message;
}

TEST(CheckpointRanks, DamageOneRankSeesIsAgreedByEveryRank) {
  const int W = comm().size(), last = W - 1;
  int32_t id = int32_t(getpid());
  comm().broadcast(&id, 1, DType::i32, 0);
  const std::string root = fmt::format("/tmp/memfit-checkpoint-ranks-{}-{}", W, id);
  std::ostringstream log;
  const nlohmann::json whole = run_training(config(6), log, nullptr, &comm());
  RunConfig saving = config(6);
  saving.checkpoint_dir = root;
  saving.checkpoint_every = 1;
  saving.keep_checkpoints = 6;
  EXPECT_EQ(losses(run_training(saving, log, nullptr, &comm())), losses(whole));

  // Only the last rank damages (and so sees) its own files of steps 6 and 5.
  const std::string file = rank_file_name(last, W);
  if (comm().rank() == last) {
    std::string bytes = test::read_bytes(root + "/step-000006/" + file);
    bytes[bytes.size() / 2] ^= 4;
    test::write_bytes(root + "/step-000006/" + file, bytes);
    fs::resize_file(root + "/step-000005/" + file, 100);
  }
  comm().barrier();

  RunConfig from_root = config(6);
  from_root.resume = root;
  std::ostringstream resumed_log;
  const nlohmann::json resumed = run_training(from_root, resumed_log, nullptr, &comm());
  EXPECT_EQ(losses(resumed), losses(whole, 4)) << "every rank resumed step 4 and continued bit for bit";
  if (comm().rank() == 0) {
    const std::string text = resumed_log.str();
    EXPECT_NE(text.find("skipped step-000006: " + root + "/step-000006/" + file + ": checksum mismatch"),
              std::string::npos) << text;
    EXPECT_NE(text.find("skipped step-000005: " + root + "/step-000005/" + file), std::string::npos) << text;
    EXPECT_NE(text.find("resumed from " + root + "/step-000004 at step 4"), std::string::npos) << text;
  }

  RunConfig named = config(7);
  named.resume = root + "/step-000006";
  expect_every_rank_refuses(named, {file, "checksum mismatch"});

  if (comm().rank() == last) fs::remove(root + "/step-000002/" + file);
  if (comm().rank() == 0) {
    nlohmann::json m = nlohmann::json::parse(test::read_bytes(root + "/step-000003/manifest.json"));
    m["ranks"].erase(size_t(last));
    test::write_bytes(root + "/step-000003/manifest.json", test::sign_manifest(m));
  }
  comm().barrier();
  named.resume = root + "/step-000002";
  expect_every_rank_refuses(named, {file, "cannot open"});
  named.resume = root + "/step-000003";
  expect_every_rank_refuses(named, {"manifest.json", "'ranks'", fmt::format("for a world of {}", W)});

  comm().barrier();
  if (comm().rank() == 0) fs::remove_all(root);
}

}  // namespace
}  // namespace memfit

int main(int argc, char** argv) {
  testing::InitGoogleTest(&argc, argv);
  if (memfit::comm().rank() != 0) {  // one report, from rank 0; every rank's failures still fail the run
    auto& listeners = testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
  }
  return RUN_ALL_TESTS();
}
