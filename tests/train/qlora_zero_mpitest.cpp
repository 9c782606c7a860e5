// A quantised base with LoRA (QLoRA) under data parallelism, under mpirun (CTest runs this with
// 2 and 4 ranks), ZeRO 0..3, as FSDP-QLoRA shards it:
// (a) at stage 3 each rank persists only a piece of every quantised weight's stored bytes (codes,
//     scales and, with double quantisation, the scales' scales and offset), the ranks' pieces
//     cover every byte once, and each piece is bitwise those bytes of the stage-0 run's whole
//     storage: initialised, and loaded from an HF checkpoint (both quantise the one-rank weight
//     and keep this rank's bytes);
// (b) the losses and the final validation loss equal the world-size-1 run's on the same global
//     batch within the ZeRO tests' tolerance (fp32 compute 1e-5 of the loss, bf16 2e-3); stage 3
//     computes with the very bytes stage 0 holds, so on power-of-two worlds (every collective
//     sums an element as the same pairwise tree) stages 1..3 reproduce stage 0 bit for bit;
// (c) planned == measured device peak on every rank, all ranks plan the same, and steps 2..
//     allocate nothing;
// (d) stage 3's variants (parameter offload, hpZ, qwZ) and its checkpoints keep those bytes.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <sstream>
#include <vector>

#include <fmt/format.h>

#include "dist/communicator.hpp"
#include "io/safetensors.hpp"
#include "runtime/executor.hpp"
#include "support/alloc_counter.hpp"
#include "support/mpi_test.hpp"
#include "support/paths.hpp"
#include "support/tensor_values.hpp"
#include "train/trainer.hpp"

namespace memfit {
namespace {

constexpr int64_t kSteps = 6, kRowsPerRank = 2;

Communicator& comm() { return test::world(); }
using test::pairwise_sums;

struct Case {
  std::string model;  // a preset, or an HF config.json
  std::string load;   // HF weights to load (quantised at load), or "" to initialise
  BaseQuant kind;
  bool double_quant;
  Precision precision;
};

std::string name_of(const Case& k) {
  return fmt::format("{}{} {}{} {}", k.model, k.load.empty() ? "" : " (loaded)", base_quant_name(k.kind),
                     k.double_quant ? "+dq" : "", precision_name(k.precision));
}

RunConfig config(const Case& k, int stage, int world) {
  RunConfig c;
  c.model = k.model;
  c.load = k.load;
  c.policy.precision = k.precision;
  c.policy.zero_stage = stage;
  c.policy.attention = AttentionKind::flash;
  c.policy.seq = 32;
  c.policy.batch = kRowsPerRank * (world == 1 ? comm().size() : 1);
  c.policy.lora.rank = 4;
  c.policy.lora.targets = {"all-linear"};
  c.policy.quantize_base.kind = k.kind;
  c.policy.quantize_base.double_quant = k.double_quant;
  c.steps = kSteps;
  c.lr = 1e-3;
  c.val_fraction = 0.05;
  c.eval_batches = 1;
  c.log_every = 0;
  return c;
}

// Every quantised parameter's stored bytes before step 1: whole tensors (stage < 3), or this
// rank's pieces (stage 3), with the allocation count of steps 2..
class StorageWatch final : public RunHooks {
 public:
  struct Piece {
    int64_t first = 0;
    std::vector<std::byte> bytes;
  };
  void before_steps(Executor& ex, const PreparedRun&) override { capture(ex, whole, pieces); }
  // After the run: what a resume restored (before_steps runs before the restore), unchanged by
  // the steps since the base is frozen.
  void after_run(Executor& ex, nlohmann::json&, std::ostream&) override { capture(ex, whole_after, pieces_after); }
  void capture(const Executor& ex, std::map<std::string, std::vector<std::byte>>& whole,
               std::map<std::string, Piece>& pieces) {
    for (const ParamEntry& e : ex.program().params()) {
      if (e.plain_storage()) continue;
      for (size_t k = 0; k < e.storage.size(); ++k) {
        const std::string key = fmt::format("{}#{}", e.name, k);
        if (e.storage_shard.empty()) whole[key] = test::tensor_bytes(ex, e.storage[k].id);
        else if (e.storage_shard[k].view != kNoTensor)
          pieces[key] = {e.storage_shard[k].first, test::tensor_bytes(ex, e.storage_shard[k].view)};
      }
    }
  }
  void before_step(int64_t step) override {
    if (step >= 2) test::alloc_counter_start();
  }
  void after_step(int64_t step, float) override {
    if (step >= 2) allocations += test::alloc_counter_stop().memfit_allocations;
  }
  std::map<std::string, std::vector<std::byte>> whole, whole_after;
  std::map<std::string, Piece> pieces, pieces_after;
  int64_t allocations = 0;
};

using Trajectory = test::LossCurve;
using test::loss_curve;

// The world-size-1 run on rank 0, shared with every rank.
Trajectory reference(const Case& k) { return test::one_rank_curve(config(k, 0, 1)); }

// (a): this rank's pieces against stage 0's whole bytes, and every byte held by one rank.
void expect_pieces_of_the_whole(const StorageWatch& stage0, const StorageWatch& stage3) {
  ASSERT_FALSE(stage0.whole.empty());
  EXPECT_TRUE(stage3.whole.empty()) << "stage 3 keeps a whole quantised tensor";
  std::vector<float> held;  // bytes of each stored tensor this rank holds, then summed over the ranks
  for (const auto& [key, bytes] : stage0.whole) {
    const auto it = stage3.pieces.find(key);
    held.push_back(it == stage3.pieces.end() ? 0.0f : float(it->second.bytes.size()));
    if (it == stage3.pieces.end()) continue;
    const StorageWatch::Piece& piece = it->second;
    ASSERT_LE(piece.first + int64_t(piece.bytes.size()), int64_t(bytes.size())) << key;
    EXPECT_TRUE(std::equal(piece.bytes.begin(), piece.bytes.end(), bytes.begin() + piece.first))
        << key << ": rank " << comm().rank() << "'s piece at byte " << piece.first << " differs from stage 0's bytes";
  }
  comm().all_reduce(held.data(), int64_t(held.size()), DType::f32, ReduceOp::sum);
  size_t i = 0;
  for (const auto& [key, bytes] : stage0.whole) EXPECT_EQ(held[i++], float(bytes.size())) << key << ": bytes held";
}

void expect_every_stage_matches_one_rank(const Case& k) {
  const double tolerance = k.precision == Precision::fp32 ? 1e-5 : 2e-3;
  const Trajectory ref = reference(k);
  std::optional<Trajectory> stage0;
  StorageWatch watch0;
  for (int stage : {0, 1, 2, 3}) {
    SCOPED_TRACE(fmt::format("{}, ZeRO stage {}, world size {}, rank {}", name_of(k), stage, comm().size(),
                             comm().rank()));
    StorageWatch watch;
    std::ostringstream log;
    const nlohmann::json report = run_training(config(k, stage, comm().size()), log, &watch, &comm());
    EXPECT_EQ(watch.allocations, 0);
    EXPECT_TRUE(report["memory"]["all_ranks_equal"].get<bool>());
    EXPECT_EQ(report["memory"]["planned_peak_bytes"]["device"], report["memory"]["measured_peak_bytes"]["device"]);
    const Trajectory t = loss_curve(report);
    const double worst = test::expect_losses_near(t.loss, ref.loss, tolerance);
    EXPECT_NEAR(t.validation, ref.validation, tolerance * ref.validation);
    if (stage == 0) {
      stage0 = t;
      watch0 = std::move(watch);
      continue;
    }
    if (pairwise_sums()) {
      EXPECT_EQ(t.loss, stage0->loss) << "power-of-two world: the same sums as stage 0";
    }
    if (stage == 3) expect_pieces_of_the_whole(watch0, watch);
    if (comm().rank() == 0)
      std::printf("  %s stage %d: largest relative loss difference %.3g\n", name_of(k).c_str(), stage, worst);
  }
}

TEST(QloraZero, Nf4DoubleQuantLlamaEveryStageMatchesOneRank) {
  expect_every_stage_matches_one_rank({"llama-tiny", "", BaseQuant::nf4, true, Precision::bf16});
}

TEST(QloraZero, Fp4Gpt2EveryStageMatchesOneRank) {
  expect_every_stage_matches_one_rank({"gpt2-tiny", "", BaseQuant::fp4, false, Precision::bf16});
}

TEST(QloraZero, Int8Fp32ComputeEveryStageMatchesOneRank) {
  expect_every_stage_matches_one_rank({"llama-tiny", "", BaseQuant::int8, false, Precision::fp32});
}

// Stage 3's variants over a quantised base: the parameter shards offloaded to host memory or
// disk, hpZ's secondary partition (its copy and gather move the bytes as fp32 words) and qwZ
// (which codes the trainable buckets' floats and gathers the quantised base's bytes as they
// are). Each keeps the quantised bytes, the losses of the world-size-1 run and its plan of
// every tier; all but qwZ compute with stage 0's very values, so on power-of-two worlds they
// reproduce its losses bit for bit.
TEST(QloraZero, Stage3OffloadHpzAndQwzKeepTheQuantisedBytes) {
  const Case k{"llama-tiny", "", BaseQuant::nf4, true, Precision::bf16};
  const Trajectory ref = reference(k);
  StorageWatch watch0;
  std::ostringstream log0;
  const Trajectory stage0 = loss_curve(run_training(config(k, 0, comm().size()), log0, &watch0, &comm()));
  struct Variant {
    const char* name;
    std::function<void(RunConfig&)> set;
    bool exact;
  };
  const std::string dir = fmt::format("/tmp/memfit-qlora-zero-{}", getpid());
  std::filesystem::create_directories(dir);
  const std::vector<Variant> variants{
      {"offload host", [](RunConfig& c) { c.policy.offload_params = Tier::host; }, true},
      {"offload disk", [&](RunConfig& c) { c.policy.offload_params = Tier::disk, c.offload_dir = dir; }, true},
      {"hpZ 2", [](RunConfig& c) { c.policy.zero_hpz_partition_size = 2; }, true},
      {"qwZ", [](RunConfig& c) { c.policy.zero_quantized_weights = true; }, false},
  };
  for (const Variant& v : variants) {
    SCOPED_TRACE(fmt::format("{}, world size {}, rank {}", v.name, comm().size(), comm().rank()));
    RunConfig c = config(k, 3, comm().size());
    v.set(c);
    StorageWatch watch;
    std::ostringstream log;
    const nlohmann::json report = run_training(c, log, &watch, &comm());
    EXPECT_EQ(watch.allocations, 0);
    EXPECT_TRUE(report["memory"]["all_ranks_equal"].get<bool>());
    EXPECT_EQ(report["memory"]["planned_peak_bytes"], report["memory"]["measured_peak_bytes"]);
    expect_pieces_of_the_whole(watch0, watch);
    const Trajectory t = loss_curve(report);
    test::expect_losses_near(t.loss, ref.loss, 2e-3);
    if (v.exact && pairwise_sums()) {
      EXPECT_EQ(t.loss, stage0.loss) << "power-of-two world: the same sums as stage 0";
    }
  }
  std::filesystem::remove_all(dir);
}

// A stage-3 checkpoint holds each rank's bytes of the quantised base (described in the stored
// tensors' own elements, none straddling two ranks). The base is loaded from HF weights, and a
// resume cannot load them (it initialises other values), so the bytes it holds come from the
// checkpoint: resumed at stage 3 the run continues bit for bit with the same pieces; resumed
// by one process at stage 0 (the checkpoint resharded) it holds the whole storage, bitwise the
// stage-0 run's, and continues within the tolerance.
TEST(QloraZero, Stage3CheckpointResumesAndReshardsTheQuantisedBase) {
  int32_t id = int32_t(getpid());
  comm().broadcast(&id, 1, DType::i32, 0);
  const Case k{test::fixture_path("llama_tiny_torch/config.json"),
               test::fixture_path("llama_tiny_torch/model.safetensors"), BaseQuant::nf4, true, Precision::bf16};
  const std::string dir = fmt::format("/tmp/memfit-qlora-zero-checkpoint-{}-{}", comm().size(), id);
  std::ostringstream log;
  StorageWatch watch0;
  run_training(config(k, 0, comm().size()), log, &watch0, &comm());
  StorageWatch watch3;
  const RunConfig whole = config(k, 3, comm().size());
  const Trajectory a = loss_curve(run_training(whole, log, &watch3, &comm()));
  RunConfig first = whole;
  first.steps = kSteps / 2;
  first.checkpoint_dir = dir;
  run_training(first, log, nullptr, &comm());
  RunConfig second = whole;
  second.load.clear();
  second.resume = dir;
  StorageWatch resumed;
  const Trajectory b = loss_curve(run_training(second, log, &resumed, &comm()));
  ASSERT_EQ(b.loss.size(), size_t(kSteps / 2));
  for (size_t i = 0; i < b.loss.size(); ++i) EXPECT_EQ(b.loss[i], a.loss[kSteps / 2 + i]) << "step " << kSteps / 2 + i + 1;
  EXPECT_EQ(b.validation, a.validation);
  ASSERT_EQ(resumed.pieces_after.size(), watch3.pieces.size());
  for (const auto& [key, piece] : watch3.pieces) {
    EXPECT_EQ(resumed.pieces_after.at(key).first, piece.first) << key;
    EXPECT_TRUE(resumed.pieces_after.at(key).bytes == piece.bytes) << key << ": restored bytes differ";
  }
  comm().barrier();
  if (comm().rank() == 0) {
    auto single = make_single_process_communicator();
    RunConfig one = config(k, 0, 1);
    one.load.clear();
    one.resume = dir;
    StorageWatch resharded;
    const Trajectory c = loss_curve(run_training(one, log, &resharded, single.get()));
    EXPECT_TRUE(resharded.whole_after == watch0.whole) << "the resharded quantised base differs from stage 0's";
    ASSERT_EQ(c.loss.size(), size_t(kSteps / 2));
    for (size_t i = 0; i < c.loss.size(); ++i)
      EXPECT_NEAR(c.loss[i], a.loss[kSteps / 2 + i], 2e-3 * a.loss[kSteps / 2 + i]) << "step " << kSteps / 2 + i + 1;
    std::filesystem::remove_all(dir);
  }
  comm().barrier();
}

// --save of a QLoRA run under ZeRO writes its PEFT adapter: the adapters gathered whole from
// the ranks' pieces (the quantised base, stored only as codes, is not gathered), the same
// values at every stage as at stage 0 (bitwise on power-of-two worlds).
TEST(QloraZero, SavedAdapterIsStageZerosAtEveryStage) {
  int32_t id = int32_t(getpid());
  comm().broadcast(&id, 1, DType::i32, 0);
  const Case k{"llama-tiny", "", BaseQuant::nf4, true, Precision::bf16};
  std::vector<std::string> dirs;
  for (int stage : {0, 1, 2, 3}) {
    RunConfig c = config(k, stage, comm().size());
    c.save = fmt::format("/tmp/memfit-qlora-zero-adapter-{}-{}-{}", comm().size(), id, stage);
    std::ostringstream log;
    run_training(c, log, nullptr, &comm());
    dirs.push_back(c.save);
  }
  comm().barrier();
  if (comm().rank() != 0) return;
  const SafetensorsReader stage0(dirs[0] + "/adapter_model.safetensors");
  ASSERT_FALSE(stage0.entries().empty());
  for (size_t d = 1; d < dirs.size(); ++d) {
    const SafetensorsReader other(dirs[d] + "/adapter_model.safetensors");
    ASSERT_EQ(other.entries().size(), stage0.entries().size()) << dirs[d];
    for (const SafetensorsEntry& t : stage0.entries()) {
      std::vector<float> want(size_t(t.shape.numel())), got(want.size());
      stage0.read_f32(t.name, t.shape, want.data());
      other.read_f32(t.name, t.shape, got.data());
      for (size_t i = 0; i < want.size(); ++i)
        ASSERT_NEAR(got[i], want[i], 1e-5 * (1 + std::abs(want[i]))) << t.name << " at stage " << d << ", element " << i;
      if (pairwise_sums()) {
        EXPECT_TRUE(got == want) << t.name << " at stage " << d;
      }
    }
  }
  for (const std::string& dir : dirs) std::filesystem::remove_all(dir);
}

// The HF weights of tests/fixtures/llama_tiny_torch, quantised while loading.
TEST(QloraZero, LoadedHfWeightsEveryStageMatchesOneRank) {
  expect_every_stage_matches_one_rank({test::fixture_path("llama_tiny_torch/config.json"),
                                       test::fixture_path("llama_tiny_torch/model.safetensors"), BaseQuant::nf4, true,
                                       Precision::bf16});
}

}  // namespace
}  // namespace memfit

int main(int argc, char** argv) { return memfit::test::run_mpi_tests(argc, argv); }
