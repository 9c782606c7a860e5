// Checkpoints of tensor-parallel runs resume on any layout (mpirun -np 2 and 4). A rank's
// parameter slice is described as runs of the one-rank tensor (graph/tensor_parallel.hpp,
// train/checkpoint_pieces.cpp), so nothing converts: with 4 ranks, tensor 2 x data 2 at ZeRO
// stage 3 saves at step 2 and resumes on 1 rank and on 4 data-parallel ranks at stage 1; with
// 2 ranks, tensor 2 resumes on 1 rank and 1 rank resumes on tensor 2. gpt2-tiny and llama-tiny
// (grouped-query attention), fp32 AdamW.
// Oracles, as in checkpoint_reshard_mpitest:
//  * the continuation: the losses of steps 3 and 4 against an uninterrupted run of the new
//    layout to 1e-6 relative. Not bit for bit: the old layout's step-2 weights come from
//    tensor-group sums in another order than the new layout's own (measured differences are
//    printed);
//  * the weights: `memfit consolidate` of the tensor-parallel checkpoint equals bit for bit the
//    --save of a one-rank run resumed from it with --lr 0 (which leaves every weight as loaded).
// Every resumed run plans what it measures on every rank, and allocates nothing in its steps.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <sstream>

#include <fmt/format.h>

#include "support/mpi_test.hpp"
#include "train/checkpoint_consolidate.hpp"
#include "train/trainer.hpp"

namespace memfit {
namespace {

namespace fs = std::filesystem;
using test::on_first_ranks;
using test::world;

struct Layout {
  int ranks, tensor, stage;
  int64_t batch, accum;  // the global batch is 4 rows on every layout
};

RunConfig config(const std::string& model, const Layout& l, int64_t steps) {
  RunConfig c;
  c.model = model;
  c.policy.zero_stage = l.stage;
  c.policy.batch = l.batch;
  c.policy.grad_accum = l.accum;
  c.policy.seq = 32;
  if (model.starts_with("llama")) c.policy.attention = AttentionKind::flash;
  c.topology.tensor = l.tensor;
  c.steps = steps;
  c.val_fraction = 0.05;
  c.eval_batches = 1;
  c.log_every = 0;
  return c;
}

std::string describe(const Layout& l) {
  return fmt::format("{} ranks (tensor {}) stage {}", l.ranks, l.tensor, l.stage);
}

void move(const std::string& model, const Layout& from, const Layout& to, const std::string& dir) {
  SCOPED_TRACE(fmt::format("{}: {} -> {} (rank {})", model, describe(from), describe(to), world().rank()));
  const std::string ckpt = dir + "/ckpt";
  std::ostringstream log;
  on_first_ranks(from.ranks, dir, [&](Communicator& c) {
    RunConfig save = config(model, from, 2);
    save.checkpoint_dir = ckpt;
    run_training(save, log, nullptr, &c);
  });
  on_first_ranks(to.ranks, dir, [&](Communicator& c) {
    RunConfig resume = config(model, to, 4);
    resume.resume = ckpt;
    const test::ResumeComparison r = test::resume_against_uninterrupted(config(model, to, 4), resume, 2, 1e-6, c);
    EXPECT_EQ(r.resumed.size(), 2u);
    if (c.rank() == 0)
      std::printf("  %s, %s -> %s: largest relative loss difference %.2e\n", model.c_str(), describe(from).c_str(),
                  describe(to).c_str(), r.worst);
  });
  if (world().rank() == 0) fs::remove_all(ckpt);
  world().barrier();
}

TEST(TensorParallelCheckpoint, ResumesOnOtherLayouts) {
  const std::string dir = test::unique_dir("tp-checkpoint");
  if (world().rank() == 0) fs::create_directories(dir);
  world().barrier();
  for (const std::string model : {"gpt2-tiny", "llama-tiny"}) {
    if (world().size() >= 4) {
      move(model, {4, 2, 3, 2, 1}, {1, 1, 0, 2, 2}, dir);
      move(model, {4, 2, 3, 2, 1}, {4, 1, 1, 1, 1}, dir);
    } else {
      move(model, {2, 2, 0, 2, 2}, {1, 1, 0, 2, 2}, dir);
      move(model, {1, 1, 0, 2, 2}, {2, 2, 1, 2, 2}, dir);
    }
  }
  if (world().rank() == 0) fs::remove_all(dir);
}

TEST(TensorParallelCheckpoint, ConsolidateEqualsTheWeightsResumedOnOneRank) {
  const std::string dir = test::unique_dir("tp-consolidate");
  if (world().rank() == 0) fs::create_directories(dir);
  world().barrier();
  const Layout tp = world().size() >= 4 ? Layout{4, 2, 3, 2, 1} : Layout{2, 2, 0, 2, 2};
  for (const std::string model : {"gpt2-tiny", "llama-tiny"}) {
    SCOPED_TRACE(fmt::format("{} on {}", model, describe(tp)));
    const std::string ckpt = dir + "/ckpt", kept = dir + "/kept", out = dir + "/out";
    std::ostringstream log;
    on_first_ranks(tp.ranks, dir, [&](Communicator& c) {
      RunConfig run = config(model, tp, 2);
      run.checkpoint_dir = ckpt;
      run_training(run, log, nullptr, &c);
    });
    if (world().rank() == 0) {
      RunConfig still = config(model, {1, 1, 0, 2, 2}, 3);
      still.resume = ckpt;
      still.lr = 0;
      still.save = kept;
      auto single = make_single_process_communicator();
      run_training(still, log, nullptr, single.get());
      consolidate_checkpoint(ckpt, out, 5'000'000'000, log);
      EXPECT_EQ(test::read_bytes(out + "/model.safetensors"), test::read_bytes(kept + "/model.safetensors"));
      fs::remove_all(ckpt), fs::remove_all(kept), fs::remove_all(out);
    }
    world().barrier();
  }
  if (world().rank() == 0) fs::remove_all(dir);
}

}  // namespace
}  // namespace memfit

int main(int argc, char** argv) { return memfit::test::run_mpi_tests(argc, argv); }
