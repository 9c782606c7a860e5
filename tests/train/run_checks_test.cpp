// What a training run checks before step 1 and after its updates (train/run_checks.hpp), through
// the CLI: each refusal is one line on stderr naming the flag or tensor, exit status 1, no
// step run (no "step" line) or nothing written, and a control run shows the refusal is the
// check's doing, not the setup's.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <vector>

#include "support/run_cli.hpp"

namespace memfit {
namespace {

namespace fs = std::filesystem;

const std::string kTiny = "train --threads 1 --batch 1 --seq 16 --log-every 0 ";

std::string fresh_dir(const std::string& name) {
  const std::string d = test::temp_dir() + "/" + name;
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

std::vector<std::string> listing(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::recursive_directory_iterator(dir)) names.push_back(e.path().string());
  std::sort(names.begin(), names.end());
  return names;
}

// One line on stderr, naming `needle`, exit status 1, and no step ran.
void expect_refused_before_step_1(const test::CliResult& r, const std::string& needle) {
  EXPECT_EQ(r.status, 1) << r.out << r.err;
  EXPECT_NE(r.err.find(needle), std::string::npos) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  EXPECT_EQ(r.out.find("step "), std::string::npos) << r.out;
}

TEST(RunChecks, ReportJsonNamingADirectoryIsRefusedAndLeavesNothing) {
  const std::string d = fresh_dir("report-dir");
  expect_refused_before_step_1(test::run_memfit(kTiny + "--steps 2 --report-json " + d), "--report-json '" + d + "'");
  EXPECT_FALSE(fs::exists(d + ".tmp"));
  EXPECT_TRUE(listing(d).empty());
}

TEST(RunChecks, UnwritableOutputPathsAreRefusedBeforeStep1) {
  const std::string d = fresh_dir("unwritable");
  test::write_file(d + "/plain-file", "x");
  // /proc takes no new files, even from root (tests may run as root, where permissions do not stop a write).
  expect_refused_before_step_1(test::run_memfit(kTiny + "--steps 2 --report-json /proc/memfit-report.json"),
                               "--report-json '/proc/memfit-report.json' cannot be written");
  expect_refused_before_step_1(test::run_memfit(kTiny + "--steps 2 --report-json " + d + "/missing/r.json"),
                               "does not exist");
  expect_refused_before_step_1(test::run_memfit(kTiny + "--steps 2 --save /proc/memfit.safetensors"),
                               "--save '/proc/memfit.safetensors' cannot be written");
  expect_refused_before_step_1(test::run_memfit(kTiny + "--steps 2 --save " + d + "/plain-file/weights"),
                               "is not a directory");
  expect_refused_before_step_1(test::run_memfit(kTiny + "--steps 2 --checkpoint-dir /proc/memfit-checkpoints"),
                               "--checkpoint-dir '/proc/memfit-checkpoints' cannot be written");
  expect_refused_before_step_1(test::run_memfit(kTiny + "--steps 2 --checkpoint-dir " + d + "/plain-file"),
                               "--checkpoint-dir");
  EXPECT_EQ(listing(d), std::vector<std::string>{d + "/plain-file"});
}

TEST(RunChecks, WritablePathsPassAndTheProbesLeaveNothingBehind) {
  const std::string d = fresh_dir("writable");
  const auto r = test::run_memfit(kTiny + "--steps 2 --report-json " + d + "/r.json --save " + d +
                                  "/w.safetensors --checkpoint-dir " + d + "/ck");
  ASSERT_EQ(r.status, 0) << r.out << r.err;
  for (const std::string& name : listing(d)) EXPECT_EQ(name.find(".memfit-probe"), std::string::npos) << name;
  EXPECT_TRUE(fs::exists(d + "/r.json"));
  EXPECT_TRUE(fs::exists(d + "/w.safetensors"));
}

// A relative --save directory that does not exist yet is made, as transformers'
// save_pretrained makes it (the check once climbed past "." and refused it).
TEST(RunChecks, ARelativeSaveDirectoryIsCreated) {
  const std::string d = fresh_dir("relative");
  const fs::path cwd = fs::current_path();
  fs::current_path(d);
  const auto r = test::run_memfit(kTiny + "--steps 2 --save weights/new");
  fs::current_path(cwd);
  ASSERT_EQ(r.status, 0) << r.out << r.err;
  EXPECT_TRUE(fs::exists(d + "/weights/new/model.safetensors"));
}

TEST(RunChecks, ABadTokenInTheValidationSplitIsFoundBeforeStep1) {
  const std::string d = fresh_dir("bad-token");
  // nanoGPT layout (raw uint16). gpt2-tiny's vocabulary is 256; token 300 sits near the end,
  // inside the validation split, past what the evaluations would ever read.
  std::vector<uint16_t> tokens(20000);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = uint16_t(i % 200);
  tokens[19990] = 300;
  test::write_file(d + "/tokens.bin", std::string(reinterpret_cast<const char*>(tokens.data()), tokens.size() * 2));
  const std::string args = kTiny + "--steps 2 --data " + d + "/tokens.bin --eval-batches 1 ";
  expect_refused_before_step_1(test::run_memfit(args + "--val-fraction 0.1"), "token 300 at position 19990");
  const auto control = test::run_memfit(args + "--val-fraction 0");  // the training split is clean
  EXPECT_EQ(control.status, 0) << control.err;
}

TEST(RunChecks, ANonFiniteUpdateStopsTheRunBeforeAnythingIsSaved) {
  const std::string d = fresh_dir("non-finite");
  const auto r = test::run_memfit(kTiny + "--steps 1 --lr 1e308 --save " + d + "/w.safetensors --checkpoint-dir " + d +
                                  "/ck --report-json " + d + "/r.json");
  EXPECT_EQ(r.status, 1) << r.out << r.err;
  EXPECT_NE(r.err.find("parameter '"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("lower --lr"), std::string::npos) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  EXPECT_TRUE(listing(d).empty());  // no weights, no checkpoint, no report
  const auto control = test::run_memfit(kTiny + "--steps 1 --save " + d + "/w.safetensors");
  EXPECT_EQ(control.status, 0) << control.err;
  EXPECT_TRUE(fs::exists(d + "/w.safetensors"));
}

TEST(RunChecks, ANonFiniteLossAfterAnOverflowingUpdateNamesTheParameterAndTheLearningRate) {
  const auto r = test::run_memfit(kTiny + "--steps 3 --lr 1e308");
  EXPECT_EQ(r.status, 1) << r.out << r.err;
  EXPECT_NE(r.err.find("the loss became"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("parameter '"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("while every optimizer state stayed finite"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("lower --lr"), std::string::npos) << r.err;
}

// beta2 = 1 makes AdamW's bias correction 1 - beta2^t zero: the weights turn NaN with the
// optimizer state finite, as an overflowing learning rate would, but the learning rate is not
// the cause. (Config checking may refuse beta2 = 1 before step 1; either way the message names
// beta2 and does not blame --lr.)
TEST(RunChecks, BadAdamWSettingsAreNotBlamedOnTheLearningRate) {
  const auto r = test::run_memfit(kTiny + "--steps 3 --beta2 1.0");
  EXPECT_EQ(r.status, 1) << r.out << r.err;
  EXPECT_NE(r.err.find("beta2"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("lower --lr"), std::string::npos) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
}

TEST(RunChecks, NonFiniteLoadedWeightsAreRefusedBeforeStep1WithoutBlamingTheLearningRate) {
  const std::string d = fresh_dir("nan-load");
  const auto saved = test::run_memfit(kTiny + "--steps 1 --save " + d + "/w.safetensors");
  ASSERT_EQ(saved.status, 0) << saved.err;
  {  // The last 4 bytes are the last element of the last tensor (an fp32 value): make it NaN.
    std::fstream f(d + "/w.safetensors", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-4, std::ios::end);
    const char nan_bits[4] = {'\xff', '\xff', '\xff', '\x7f'};
    f.write(nan_bits, 4);
  }
  const auto r = test::run_memfit(kTiny + "--steps 2 --load " + d + "/w.safetensors");
  expect_refused_before_step_1(r, "before step 1, parameter '");
  EXPECT_NE(r.err.find("--load '" + d + "/w.safetensors'"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("--lr"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace memfit
