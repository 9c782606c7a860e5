// What the tests run under mpirun (tests/**/*_mpitest.cpp) share: the world communicator, a
// main that prints one report (rank 0's; every rank's failures still fail the run), a run
// hook that counts memfit's allocations in steps 2.. (step 1 may touch lazily initialised
// library state), and a training run on the world with its losses, report and that count.
#pragma once

#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "dist/communicator.hpp"
#include "support/alloc_counter.hpp"
#include "train/checkpoint_tamper.hpp"
#include "train/run_hooks.hpp"
#include "train/trainer.hpp"

namespace memfit::test {

inline Communicator& world() {
  static std::unique_ptr<Communicator> c = make_mpi_communicator();
  return *c;
}

// Power-of-two worlds sum every element as the same pairwise tree over rank order, whichever
// collective and block carries it (dist/mpi_ring.hpp), so ZeRO's stages agree bit for bit there.
inline bool pairwise_sums() { return (world().size() & (world().size() - 1)) == 0; }

// Each loss of `got` within `tolerance` of `want`'s, relative; returns the largest relative
// difference.
inline double expect_losses_near(const std::vector<float>& got, const std::vector<float>& want, double tolerance) {
  EXPECT_EQ(got.size(), want.size());
  double worst = 0;
  for (size_t i = 0; i < std::min(got.size(), want.size()); ++i) {
    worst = std::max(worst, std::abs(double(got[i]) - double(want[i])) / double(want[i]));
    EXPECT_NEAR(got[i], want[i], tolerance * want[i]) << "step " << i + 1;
  }
  return worst;
}

class StepAllocations final : public RunHooks {
 public:
  void before_step(int64_t step) override {
    if (step >= 2) alloc_counter_start();
  }
  void after_step(int64_t step, float) override {
    if (step >= 2) allocations += alloc_counter_stop().memfit_allocations;
  }
  int64_t allocations = 0;
};

struct WorldRun {
  std::vector<double> loss;  // the training loss of every step
  nlohmann::json report;
  int64_t allocations = 0;  // by memfit code in steps 2..
};

inline WorldRun run_on_world(const RunConfig& c) {
  StepAllocations watch;
  std::ostringstream log;
  WorldRun r;
  r.report = run_training(c, log, &watch, &world());
  for (const auto& x : r.report["loss"]["history"]) r.loss.push_back(x.get<double>());
  r.allocations = watch.allocations;
  return r;
}

// The bytes one rank sends per step for `purpose` (zero.hpp: comm_purpose_name).
inline double bytes_sent_for(const WorldRun& r, const char* purpose) {
  return r.report["distributed"]["communication"]["by_purpose"][purpose].get<double>();
}

// The losses of a report's steps from index `from` on.
inline std::vector<float> losses_from(const nlohmann::json& report, size_t from) {
  std::vector<float> v;
  for (size_t i = from; i < report["loss"]["history"].size(); ++i) v.push_back(report["loss"]["history"][i].get<float>());
  return v;
}

// A run's training losses and its last validation loss.
struct LossCurve {
  std::vector<float> loss;
  float validation = 0;
};
inline LossCurve loss_curve(const nlohmann::json& report) {
  return {losses_from(report, 0), report["validation"]["last"].get<float>()};
}

// The world-size-1 run of c (its steps and a validation), computed by rank 0 and shared with
// every rank: the oracle of the data-parallel runs of the same global batch.
inline LossCurve one_rank_curve(const RunConfig& c) {
  std::vector<float> buf(size_t(c.steps) + 1, 0.0f);
  if (world().rank() == 0) {
    auto single = make_single_process_communicator();
    std::ostringstream log;
    const LossCurve t = loss_curve(run_training(c, log, nullptr, single.get()));
    EXPECT_EQ(t.loss.size(), size_t(c.steps));
    std::copy_n(t.loss.begin(), std::min(t.loss.size(), size_t(c.steps)), buf.begin());
    buf.back() = t.validation;
  }
  world().broadcast(buf.data(), int64_t(buf.size()), DType::f32, 0);
  return {std::vector<float>(buf.begin(), buf.end() - 1), buf.back()};
}

// A resumed run against the uninterrupted run of the same layout (collective over c): runs
// `whole`, then `resumed` (the same run with --resume of a checkpoint after step `saved_step`),
// expects every later loss within `bound` (relative), every planned tier measured on every
// rank and no allocation in steps 2..; returns both loss lists.
struct ResumeComparison {
  std::vector<float> resumed, uninterrupted;
  double worst = 0;  // the largest relative difference
};
inline ResumeComparison resume_against_uninterrupted(const RunConfig& whole, const RunConfig& resumed, size_t saved_step,
                                                     double bound, Communicator& c) {
  std::ostringstream log;
  const nlohmann::json ref = run_training(whole, log, nullptr, &c);
  StepAllocations count;
  const nlohmann::json run = run_training(resumed, log, &count, &c);
  ResumeComparison r{losses_from(run, 0), losses_from(ref, saved_step), 0};
  EXPECT_EQ(r.resumed.size(), r.uninterrupted.size());
  for (size_t i = 0; i < std::min(r.resumed.size(), r.uninterrupted.size()); ++i) {
    const double want = r.uninterrupted[i], got = r.resumed[i];
    EXPECT_NEAR(got, want, bound * std::abs(want)) << "step " << saved_step + i + 1;
    r.worst = std::max(r.worst, std::abs(got - want) / std::abs(want));
  }
  for (const auto& [tier, planned] : run["memory"]["planned_peak_bytes"].items())
    EXPECT_EQ(planned, run["memory"]["measured_peak_bytes"][tier]) << tier;
  EXPECT_TRUE(run["memory"]["all_ranks_equal"].get<bool>());
  EXPECT_EQ(count.allocations, 0);
  return r;
}

// A directory name under the temporary directory that every rank agrees on (rank 0's pid).
inline std::string unique_dir(const std::string& what) {
  int32_t id = int32_t(getpid());
  world().broadcast(&id, 1, DType::i32, 0);
  return fmt::format("{}/memfit-{}-{}", std::filesystem::temp_directory_path().string(), what, id);
}

// Runs work(comm) on the first `ranks` ranks; the others sleep meanwhile instead of spinning
// in an MPI wait (CTest runs 4 ranks on 2 cores). Collective over the world; `dir` (existing)
// holds the marker files that wake the sleepers.
template <typename F>
void on_first_ranks(int ranks, const std::string& dir, F work) {
  static int phase = 0;
  const std::string marker = fmt::format("{}/phase-{}.done", dir, phase++);
  std::unique_ptr<Communicator> c = world().split(world().rank() < ranks ? 0 : 1, world().rank());
  if (world().rank() < ranks) {
    try {
      work(*c);
    } catch (const std::exception& e) {
      ADD_FAILURE() << e.what();
    }
    c->barrier();
    if (world().rank() == 0) write_bytes(marker, "");
  } else {
    while (!std::filesystem::exists(marker)) usleep(5000);
  }
  world().barrier();
}

inline int run_mpi_tests(int argc, char** argv) {
  testing::InitGoogleTest(&argc, argv);
  if (world().rank() != 0) {
    auto& listeners = testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
  }
  return RUN_ALL_TESTS();
}

}  // namespace memfit::test
