// Optimizer offload with data parallelism under mpirun (CTest runs this with 2 and 4 ranks):
// for ZeRO stages 0..3, gpt2-tiny and llama-tiny, fp32 and bf16, AdamW and 8-bit AdamW, the
// loss history and the final validation loss with the optimizer on the host tier or on disk
// are bitwise those of the same world with the optimizer resident; every rank's plan equals
// its measured high-water on every tier (the disk tier's file included), each rank's offload
// tier holds its own piece of the optimizer's tensors (the offload tier's bytes fall as the
// world grows from stage 1 on), and steps 2.. allocate nothing.
// Parameter offload at stage 3 likewise: over 10 steps, for both models, fp32 and bf16, AdamW and
// 8-bit AdamW, the parameter shards on disk with the optimizer resident, and on the host or on
// disk (alternating) with the optimizer on disk, give the resident parameters' bits; every rank
// plans what it measures on every tier, its offload tier holds exactly its own shards (what the
// resident run kept on the device), and steps 2.. allocate nothing.
#include <gtest/gtest.h>

#include <unistd.h>

#include <bit>
#include <filesystem>
#include <sstream>

#include <fmt/format.h>

#include "dist/communicator.hpp"
#include "support/mpi_test.hpp"
#include "train/trainer.hpp"

namespace memfit {
namespace {

namespace fs = std::filesystem;

Communicator& comm() { return test::world(); }

RunConfig config(const std::string& model, const Policy& policy, const std::string& dir) {
  RunConfig c;
  c.model = model;
  c.policy = policy;
  c.policy.seq = 32;
  c.policy.batch = 2;
  c.policy.grad_clip = 1.0;
  if (model.starts_with("llama")) c.policy.attention = AttentionKind::flash;
  c.steps = 10;
  c.val_fraction = 0.05;
  c.eval_batches = 1;
  c.log_every = 0;
  c.offload_dir = dir;
  return c;
}

std::vector<uint32_t> bits_of(const nlohmann::json& report) {
  std::vector<uint32_t> bits;
  for (const auto& x : report["loss"]["history"]) bits.push_back(std::bit_cast<uint32_t>(x.get<float>()));
  bits.push_back(std::bit_cast<uint32_t>(report["validation"]["last"].get<float>()));
  return bits;
}

TEST(OptimizerOffloadZero, EveryStageBitwiseThatOfTheResidentOptimizer) {
  // One directory per rank's process (the tier's file is named by rank anyway).
  const std::string dir = fmt::format("{}/memfit-offload-zero-{}", fs::temp_directory_path().string(), getpid());
  fs::create_directories(dir);
  int case_index = 0;
  for (const std::string model : {"gpt2-tiny", "llama-tiny"})
    for (int stage = 0; stage <= 3; ++stage)
      for (Precision precision : {Precision::fp32, Precision::bf16}) {
        Policy p;
        p.zero_stage = stage;
        p.precision = precision;
        // Alternate the optimizer and the offload tier across cases to keep the test short:
        // every stage sees both optimizers and both tiers over the two models.
        p.optimizer = (case_index / 2) % 2 == 0 ? OptimizerKind::adamw : OptimizerKind::adamw8bit;
        const Tier tier = case_index % 2 == 0 ? Tier::disk : Tier::host;
        ++case_index;
        SCOPED_TRACE(fmt::format("{} stage {} {} {} {} on rank {}", model, stage, precision_name(precision),
                                 p.optimizer == OptimizerKind::adamw ? "adamw" : "adamw8bit", tier_name(tier),
                                 comm().rank()));
        std::ostringstream log;
        const nlohmann::json resident = run_training(config(model, p, dir), log, nullptr, &comm());
        p.offload_optimizer = tier;
        p.offload_chunk_elements = 4096;
        test::StepAllocations count;
        const nlohmann::json offloaded = run_training(config(model, p, dir), log, &count, &comm());
        EXPECT_EQ(bits_of(offloaded), bits_of(resident));
        for (const char* t : {"device", "host", "disk"})
          EXPECT_EQ(offloaded["memory"]["planned_peak_bytes"][t], offloaded["memory"]["measured_peak_bytes"][t]) << t;
        EXPECT_TRUE(offloaded["memory"]["all_ranks_equal"].get<bool>());
        const auto& off = offloaded["memory"]["tiers"][std::string(tier_name(tier))]["by_category"];
        const auto& res = resident["memory"]["tiers"]["device"]["by_category"];
        EXPECT_EQ(off["optimizer_state"].get<uint64_t>() + off["master_weights"].get<uint64_t>(),
                  res["optimizer_state"].get<uint64_t>() + res["master_weights"].get<uint64_t>())
            << "the offload tier holds exactly what the resident run kept on the device";
        EXPECT_EQ(count.allocations, 0);
      }
  comm().barrier();
  fs::remove_all(dir);
}

TEST(ParamOffloadZero, StageThreeBitwiseThatOfResidentParameters) {
  const std::string dir = fmt::format("{}/memfit-param-offload-zero-{}", fs::temp_directory_path().string(), getpid());
  fs::create_directories(dir);
  int case_index = 0;
  for (const std::string model : {"gpt2-tiny", "llama-tiny"})
    for (Precision precision : {Precision::fp32, Precision::bf16})
      for (OptimizerKind optimizer : {OptimizerKind::adamw, OptimizerKind::adamw8bit}) {
        Policy p;
        p.zero_stage = 3;
        p.precision = precision;
        p.optimizer = optimizer;
        RunConfig base = config(model, p, dir);
        base.steps = 10;
        std::ostringstream log;
        const nlohmann::json resident = run_training(base, log, nullptr, &comm());
        const uint64_t shards = resident["memory"]["tiers"]["device"]["by_category"]["parameters"].get<uint64_t>();
        const Tier with_optimizer = case_index++ % 2 == 0 ? Tier::host : Tier::disk;
        for (const auto& [params, opt] : {std::pair{Tier::disk, Tier::device}, std::pair{with_optimizer, Tier::disk}}) {
          SCOPED_TRACE(fmt::format("{} {} {} params {} optimizer {} on rank {}", model, precision_name(precision),
                                   optimizer == OptimizerKind::adamw ? "adamw" : "adamw8bit", tier_name(params),
                                   tier_name(opt), comm().rank()));
          RunConfig c = base;
          c.policy.offload_params = params;
          c.policy.offload_optimizer = opt;
          c.policy.offload_chunk_elements = opt == Tier::disk ? 4096 : 0;
          test::StepAllocations count;
          const nlohmann::json offloaded = run_training(c, log, &count, &comm());
          EXPECT_EQ(bits_of(offloaded), bits_of(resident));
          for (const char* t : {"device", "host", "disk"})
            EXPECT_EQ(offloaded["memory"]["planned_peak_bytes"][t], offloaded["memory"]["measured_peak_bytes"][t]) << t;
          EXPECT_TRUE(offloaded["memory"]["all_ranks_equal"].get<bool>());
          const auto& tiers = offloaded["memory"]["tiers"];
          EXPECT_EQ(tiers[std::string(tier_name(params))]["by_category"]["parameters"].get<uint64_t>(), shards);
          EXPECT_EQ(tiers["device"]["by_category"].value("parameters", uint64_t(0)), 0u);
          EXPECT_EQ(count.allocations, 0);
        }
      }
  comm().barrier();
  fs::remove_all(dir);
}

}  // namespace
}  // namespace memfit

int main(int argc, char** argv) { return memfit::test::run_mpi_tests(argc, argv); }
