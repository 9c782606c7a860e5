// Tensor parallelism under mpirun (CTest runs this with 2 and 4 ranks: tensor 2 x data 1, and
// tensor 2 x data 2). Oracle: the one-rank run of the same global batch, computed in process.
//
// 0. Initial values: every slice's are the one-rank tensor's, bit for bit.
// 1. Gradients. After two accumulated micro-steps (persistent gradients, ZeRO stage 0: every
//    gradient whole on its rank) and the data group's sums that open the optimizer section, each rank's gradient of every parameter equals the one-rank
//    gradient at the elements its slice holds (graph/tensor_parallel.hpp slice_runs), to 1e-5
//    of the tensor's largest gradient; the loss to 1e-6. The tensor group sums partial
//    products (row-parallel outputs, the replicated inputs' gradients) in another order than
//    one rank's product does, so fp32 agrees to rounding, not bit for bit.
// Each with and without sequence parallelism.
// 2. Trajectories. run_training for 10 steps (AdamW, clipping by the global norm, whose
//    replicated parameters count once) at ZeRO stages 0..3 over the data group: losses and
//    norms within 1e-5 relative of the one-rank run, planned == measured device bytes on every
//    rank and no allocation inside steps 2..10. bf16 within 2e-3 (bf16 tolerance: the ranks
//    round partial sums to bf16 before the group sums them).
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <filesystem>
#include <functional>
#include <memory>
#include <sstream>
#include <vector>

#include <fmt/format.h>

#include "graph/training_program.hpp"
#include "kernels/backend.hpp"
#include "runtime/collective_op.hpp"
#include "runtime/compile.hpp"
#include "runtime/executor.hpp"
#include "support/mpi_test.hpp"
#include "support/tensor_values.hpp"
#include "io/safetensors.hpp"
#include "train/init.hpp"

namespace memfit {
namespace {

using test::world;

constexpr int kTensor = 2;
constexpr int64_t kRowsPerRank = 2, kSeq = 32, kMicro = 2;

int data_degree() { return world().size() / kTensor; }

// Rows of the global batch: micro-step m, data rank d reads rows [(m * D + d) * b, ... + b).
std::vector<int32_t> tokens_of(int64_t rows, int shift) {
  std::vector<int32_t> t(size_t(rows * kSeq));
  for (size_t i = 0; i < t.size(); ++i) t[i] = int32_t((i * 37 + size_t(shift) * 37 + i / (5 + shift)) % 256);
  return t;
}

struct Stepper {
  std::unique_ptr<Backend> backend = make_cpu_backend();
  CompiledProgram compiled;
  std::unique_ptr<CommGroups> groups;
  std::unique_ptr<Executor> ex;
  std::vector<int32_t> tokens, targets;

  // rows: this program's batch; offset(m): the first global row micro-step m reads.
  Stepper(const ModelSpec& spec, const Policy& pol, const Topology& topo, Communicator* comm,
          std::function<int64_t(int)> offset) {
    compiled = compile_program(build_training_program(spec, pol, topo, cpu_capabilities()), *backend);
    if (comm) groups = std::make_unique<CommGroups>(*comm, topo, 1, &compiled.program);
    ex = std::make_unique<Executor>(compiled, *backend, groups.get());
    initialize_parameters(*ex, spec, 7);
    zero_persistent_state(*ex);
    const int64_t all_rows = kRowsPerRank * data_degree() * kMicro;
    tokens = tokens_of(all_rows, 0);
    targets = tokens_of(all_rows, 1);
    const TensorId tok = compiled.program.find_tensor(kTokens), tgt = compiled.program.find_tensor(kTargets);
    const int64_t count = pol.batch * kSeq;
    ex->set_input_handler([this, tok, tgt, count, offset](const Op&, const StepContext& ctx) {
      const size_t first = size_t(offset(ctx.micro) * kSeq);
      ex->write_as<int32_t>(tok, std::span<const int32_t>(tokens).subspan(first, size_t(count)));
      ex->write_as<int32_t>(tgt, std::span<const int32_t>(targets).subspan(first, size_t(count)));
    });
  }
  const Program& program() const { return compiled.program; }
  void micro_steps() {
    StepContext ctx;
    ctx.micro_count = int(kMicro);
    for (int m = 0; m < kMicro; ++m) {
      ctx.micro = m;
      ex->run_section(SectionKind::micro, ctx);
    }
    if (program().find_section(SectionKind::sync)) ex->run_section(SectionKind::sync, ctx);
    // With accumulation, ZeRO stage 0 sums the gradients over the data group at the start of
    // the optimizer section: run those collectives, stop before the update.
    const Section* opt = program().find_section(SectionKind::optimizer);
    int end = opt->begin;
    while (end < opt->end && (is_collective_kind(program().op(end).kind) || program().op(end).kind == OpKind::wait))
      ++end;
    ex->run_ops(opt->begin, end, ctx);
  }
};

Policy gradient_policy() {
  Policy p;
  p.seq = kSeq;
  p.grad_accum = int(kMicro);
  p.with_eval = false;
  return p;
}

void expect_gradients_match_one_rank(const std::string& model, bool sequence_parallel = false) {
  const ModelSpec spec = model_preset(model);
  const int D = data_degree();
  const Topology topo{.data = D, .tensor = kTensor, .rank = world().rank()};
  Policy one = gradient_policy();
  one.batch = kRowsPerRank * D;
  Stepper ref(spec, one, Topology{}, nullptr, [&](int m) { return int64_t(m) * one.batch; });
  Policy mine = gradient_policy();
  mine.batch = kRowsPerRank;
  mine.sequence_parallel = sequence_parallel;
  Stepper tp(spec, mine, topo, &world(),
             [&](int m) { return (int64_t(m) * D + topo.data_rank()) * kRowsPerRank; });
  ref.micro_steps();
  tp.micro_steps();
  const float ref_loss = ref.ex->read_scalar<float>(ref.program().find_tensor(kLoss));
  const float tp_loss = tp.ex->read_scalar<float>(tp.program().find_tensor(kLoss));
  EXPECT_NEAR(tp_loss, ref_loss, 1e-6 * ref_loss);
  ASSERT_EQ(tp.program().params().size(), ref.program().params().size());
  int split = 0;
  double worst = 0;
  for (size_t i = 0; i < ref.program().params().size(); ++i) {
    const ParamEntry& r = ref.program().params()[i];
    const ParamEntry& e = tp.program().params()[i];
    ASSERT_EQ(e.name, r.name);
    const std::vector<float> want = test::tensor_values<float>(*ref.ex, r.grad);
    const std::vector<float> got = test::tensor_values<float>(*tp.ex, e.grad);
    const Shape& local = tp.program().tensor(e.value).shape;
    ASSERT_EQ(int64_t(got.size()), local.numel()) << e.name;
    split += e.split.split();
    if (e.split.split()) {
      ASSERT_EQ(e.split.global, ref.program().tensor(r.value).shape) << e.name;
    }
    double scale = 0, diff = 0;
    for (float w : want) scale = std::max(scale, double(std::fabs(w)));
    int64_t covered = 0;
    for (const SliceRun& run : slice_runs(e.split, local)) {
      covered += run.count;
      for (int64_t j = 0; j < run.count; ++j)
        diff = std::max(diff, std::fabs(double(got[size_t(run.local + j)]) - double(want[size_t(run.global + j)])));
    }
    EXPECT_EQ(covered, local.numel()) << e.name;
    const double err = scale > 0 ? diff / scale : diff;
    EXPECT_LE(err, 1e-5) << e.name;
    worst = std::max(worst, err);
  }
  EXPECT_GT(split, 0);
  if (world().rank() == 0)
    std::printf("  %s%s: loss %.7f (one rank %.7f), largest normalised gradient difference %.3g over %d split tensors\n",
                model.c_str(), sequence_parallel ? " (sequence parallel)" : "", tp_loss, ref_loss, worst, split);
}

// 0. Initial values, bit for bit: a slice draws the one-rank tensor's values at its elements.
// Widths where a row's slice crosses a random stream's end (65536 elements: GPT-2's c_fc rows
// of 768 split in two, a 256-wide Llama's down_proj rows of 384) and where many rows share one.
void expect_initial_values_are_the_one_rank_values(ModelSpec spec) {
  const Topology topo{.data = data_degree(), .tensor = kTensor, .rank = world().rank()};
  Policy pol = gradient_policy();
  pol.batch = kRowsPerRank;
  Stepper ref(spec, pol, Topology{}, nullptr, [](int) { return int64_t(0); });
  Stepper tp(spec, pol, topo, &world(), [](int) { return int64_t(0); });
  int64_t runs = 0, compared = 0;
  for (size_t i = 0; i < ref.program().params().size(); ++i) {
    const ParamEntry& r = ref.program().params()[i];
    const ParamEntry& e = tp.program().params()[i];
    const std::vector<float> want = test::tensor_values<float>(*ref.ex, r.value);
    const std::vector<float> got = test::tensor_values<float>(*tp.ex, e.value);
    for (const SliceRun& run : slice_runs(e.split, tp.program().tensor(e.value).shape)) {
      ++runs;
      for (int64_t j = 0; j < run.count; ++j, ++compared)
        ASSERT_EQ(std::bit_cast<uint32_t>(got[size_t(run.local + j)]), std::bit_cast<uint32_t>(want[size_t(run.global + j)]))
            << e.name << " element " << run.local + j;
    }
  }
  EXPECT_GT(runs, int64_t(ref.program().params().size()));  // column splits: a run per row
  EXPECT_GT(compared, 0);
}

TEST(TensorParallel, InitialValuesAreTheOneRankValuesBitForBit) {
  ModelSpec gpt2 = model_preset("gpt2-tiny");
  gpt2.n_embd = 192;
  gpt2.n_inner = 768;
  expect_initial_values_are_the_one_rank_values(gpt2);
  ModelSpec llama = model_preset("llama-tiny");
  llama.n_embd = 256;
  llama.n_inner = 384;
  expect_initial_values_are_the_one_rank_values(llama);
}

TEST(TensorParallel, Gpt2GradientsAreTheOneRankGradientsSlices) { expect_gradients_match_one_rank("gpt2-tiny"); }

// Grouped-query attention: 4 heads and 2 key/value heads, one of each kind per rank.
TEST(TensorParallel, LlamaGradientsAreTheOneRankGradientsSlices) { expect_gradients_match_one_rank("llama-tiny"); }

// Sequence parallelism: row shards between the products, the norms' gradients summed over the
// group, the gathered rows gathered again for the backward.
TEST(TensorParallel, SequenceParallelGradientsAreTheOneRankGradientsSlices) {
  expect_gradients_match_one_rank("gpt2-tiny", true);
  expect_gradients_match_one_rank("llama-tiny", true);
}

RunConfig run_config(const std::string& model, const Policy& policy, int tensor, int64_t batch) {
  RunConfig c;
  c.model = model;
  c.policy = policy;
  c.policy.seq = kSeq;
  c.policy.batch = batch;
  c.topology.tensor = tensor;
  c.steps = 10;
  c.lr = 1e-3;
  c.val_fraction = 0.05;
  c.eval_batches = 1;
  c.log_every = 0;
  return c;
}

struct Trajectory {
  std::vector<float> loss, norm;
};

Trajectory trajectory_of(const nlohmann::json& report) {
  Trajectory t;
  for (const auto& x : report["loss"]["history"]) t.loss.push_back(x.get<float>());
  if (report.contains("grad_norm_history"))
    for (const auto& x : report["grad_norm_history"]) t.norm.push_back(x.get<float>());
  return t;
}

void expect_trajectories_match_one_rank(const std::string& model, Policy base, std::initializer_list<int> stages,
                                        double tolerance) {
  base.grad_clip = 0.5;
  const int D = data_degree();
  std::ostringstream log;
  auto single = make_single_process_communicator();
  Policy one_rank = base;
  one_rank.sequence_parallel = false;
  const Trajectory ref =
      trajectory_of(run_training(run_config(model, one_rank, 1, kRowsPerRank * D), log, nullptr, single.get()));
  ASSERT_EQ(ref.loss.size(), 10u);
  ASSERT_EQ(ref.norm.size(), 10u);
  for (int stage : stages) {
    SCOPED_TRACE(fmt::format("{}: tensor {} x data {}, ZeRO stage {}, rank {}", model, kTensor, D, stage, world().rank()));
    Policy p = base;
    p.zero_stage = stage;
    const test::WorldRun run = test::run_on_world(run_config(model, p, kTensor, kRowsPerRank));
    const Trajectory t = trajectory_of(run.report);
    ASSERT_EQ(t.loss.size(), ref.loss.size());
    ASSERT_EQ(t.norm.size(), ref.norm.size());
    double worst = 0;
    for (size_t i = 0; i < t.loss.size(); ++i) {
      worst = std::max(worst, std::fabs(double(t.loss[i]) - double(ref.loss[i])) / double(ref.loss[i]));
      EXPECT_NEAR(t.loss[i], ref.loss[i], tolerance * ref.loss[i]) << "step " << i + 1;
      // 16-bit gradients: after the first step (the same weights on both sides) the norms drift
      // apart as in zero_mpitest (30x the loss tolerance there too; measured here up to 4e-3
      // at tensor 2 x data 2 with sequence parallelism, whose norm gradients are summed in bf16).
      const double norm_tolerance = i == 0 || base.grad_dtype == DType::f32 ? tolerance : 30 * tolerance;
      EXPECT_NEAR(t.norm[i], ref.norm[i], norm_tolerance * ref.norm[i]) << "grad norm, step " << i + 1;
    }
    EXPECT_TRUE(run.report["memory"]["all_ranks_equal"].get<bool>());
    EXPECT_EQ(run.report["memory"]["planned_peak_bytes"]["device"], run.report["memory"]["measured_peak_bytes"]["device"]);
    EXPECT_EQ(run.allocations, 0);
    EXPECT_GT(test::bytes_sent_for(run, "tensor_parallel"), 0);
    if (world().rank() == 0) std::printf("  %s stage %d: largest relative loss difference %.3g\n", model.c_str(), stage, worst);
  }
}

TEST(TensorParallel, Gpt2Fp32EveryZeroStageMatchesOneRank) {
  expect_trajectories_match_one_rank("gpt2-tiny", Policy{}, {0, 1, 2, 3}, 1e-5);
}

TEST(TensorParallel, LlamaFp32EveryZeroStageMatchesOneRank) {
  Policy p;
  p.attention = AttentionKind::flash;
  expect_trajectories_match_one_rank("llama-tiny", p, {0, 1, 2, 3}, 1e-5);
}

TEST(TensorParallel, SequenceParallelEveryZeroStageMatchesOneRank) {
  Policy p;
  p.sequence_parallel = true;
  expect_trajectories_match_one_rank("gpt2-tiny", p, {0, 1, 2, 3}, 1e-5);
  p.attention = AttentionKind::flash;
  expect_trajectories_match_one_rank("llama-tiny", p, {0, 3}, 1e-5);
}

// --freeze under tensor parallelism: frozen slices, row-parallel weights, replicated norms and
// the (tied) embedding keep no gradient, master or state; what trains matches one rank.
TEST(TensorParallel, FrozenParametersMatchOneRank) {
  Policy p;
  p.freeze = {"h.0.*", "wte.weight", "h.1.attn.c_proj.weight", "h.1.ln_2.*"};
  expect_trajectories_match_one_rank("gpt2-tiny", p, {0, 3}, 1e-5);
  p.sequence_parallel = true;
  expect_trajectories_match_one_rank("gpt2-tiny", p, {2}, 1e-5);
  Policy q;
  q.attention = AttentionKind::flash;
  q.freeze = {"layers.0.*", "embed_tokens.weight", "layers.1.mlp.down_proj.weight", "norm.weight"};
  expect_trajectories_match_one_rank("llama-tiny", q, {0, 3}, 1e-5);
}

// LoRA on every linear layer under tensor parallelism (graph/lora.cpp): a column-parallel
// weight's A replicated and B split as its rows (GPT-2's fused c_attn by its q, k, v segments),
// a row-parallel weight's A split as its columns and B replicated, the replicated factor's
// partial gradients summed over the tensor group. The base is frozen; losses and gradient
// norms (which count the adapters) match one rank's.
TEST(TensorParallel, LoraMatchesOneRank) {
  Policy p;
  p.lora.rank = 4;
  p.lora.targets = {"all-linear"};
  expect_trajectories_match_one_rank("gpt2-tiny", p, {0, 3}, 1e-5);
  Policy q = p;
  q.attention = AttentionKind::flash;
  expect_trajectories_match_one_rank("llama-tiny", q, {0, 3}, 1e-5);
  p.sequence_parallel = true;
  expect_trajectories_match_one_rank("gpt2-tiny", p, {2}, 1e-5);
}

// LoRA's dropout draws the one-rank run's mask on every rank's part (core/dropout_mask.hpp
// DropoutLayout): a data rank's rows follow the lower ranks' in the global batch, and a
// row-parallel input (o_proj, down_proj, GPT-2's c_proj) is a column slice of the one-rank x.
TEST(TensorParallel, LoraDropoutMatchesOneRank) {
  Policy p;
  p.lora.rank = 4;
  p.lora.targets = {"all-linear"};
  p.lora.dropout = 0.25;
  expect_trajectories_match_one_rank("gpt2-tiny", p, {0, 2}, 1e-5);
  p.attention = AttentionKind::flash;
  expect_trajectories_match_one_rank("llama-tiny", p, {0}, 1e-5);
  p.sequence_parallel = true;
  expect_trajectories_match_one_rank("llama-tiny", p, {3}, 1e-5);
}

// Recomputation replays the forward's tensor-group sums; bf16 rounds each rank's partial sums.
TEST(TensorParallel, Bf16WithRecomputationMatchesOneRank) {
  Policy p;
  p.precision = Precision::bf16;
  p.grad_dtype = DType::bf16;
  p.attention = AttentionKind::flash;
  p.recompute = parse_recompute("full");
  expect_trajectories_match_one_rank("gpt2-tiny", p, {0, 3}, 2e-3);
  p.sequence_parallel = true;
  expect_trajectories_match_one_rank("gpt2-tiny", p, {3}, 2e-3);
}

// HF weights load into a tensor-parallel run as into one rank: each rank stores its slice of
// every tensor (train/weights.cpp, store_global_range), so the two runs continue alike. Weights
// saved by a one-rank run (gpt2-tiny: transposed Conv1D tensors and the tied table; llama-tiny:
// q, k and v fused into the grouped-query qkv rows) give the same 3 losses to 1e-5.
TEST(TensorParallel, LoadsHfWeightsAsOneRankDoes) {
  const std::string dir = test::unique_dir("tp-load");
  auto single = make_single_process_communicator();
  for (const std::string model : {"gpt2-tiny", "llama-tiny"}) {
    SCOPED_TRACE(model);
    Policy p;
    if (model.starts_with("llama")) p.attention = AttentionKind::flash;
    std::ostringstream log;
    if (world().rank() == 0) {
      RunConfig save = run_config(model, p, 1, kRowsPerRank);
      save.steps = 3;
      save.save = dir + "/" + model;
      run_training(save, log, nullptr, single.get());
    }
    world().barrier();
    RunConfig one = run_config(model, p, 1, kRowsPerRank * data_degree());
    one.steps = 3;
    one.load = dir + "/" + model;
    const Trajectory want = trajectory_of(run_training(one, log, nullptr, single.get()));
    RunConfig tp = run_config(model, p, kTensor, kRowsPerRank);
    tp.steps = 3;
    tp.load = one.load;
    const test::WorldRun got = test::run_on_world(tp);
    ASSERT_EQ(got.loss.size(), want.loss.size());
    for (size_t i = 0; i < want.loss.size(); ++i)
      EXPECT_NEAR(got.loss[i], want.loss[i], 1e-5 * want.loss[i]) << "step " << i + 1;
    world().barrier();
  }
  if (world().rank() == 0) std::filesystem::remove_all(dir);
}

// A LoRA run's adapter saved under tensor parallelism (train/whole_weights.cpp: each rank's
// slices summed into the global tensors over its tensor group) is the one-rank run's adapter:
// the same tensors, values to 1e-3 of each tensor's largest, modules_to_save (lm_head, the
// norms) and rsLoRA included. Loaded back with --load-adapter (each rank storing its slices),
// the next steps give the one-rank continuation's losses. Under ZeRO-3 each tensor rank's
// slices are sharded over its data group too, and gathered there first.
class TensorParallelAdapter : public ::testing::TestWithParam<int> {};

TEST_P(TensorParallelAdapter, SavesAndLoadsALoraAdapterAsOneRankDoes) {
  const std::string dir = test::unique_dir("tp-adapter");
  auto single = make_single_process_communicator();
  Policy p;
  p.attention = AttentionKind::flash;
  p.lora.rank = 4;
  p.lora.targets = {"all-linear"};
  p.lora.rslora = true;
  p.lora.modules_to_save = {"lm_head", "norm"};
  std::ostringstream log;
  RunConfig one = run_config("llama-tiny", p, 1, kRowsPerRank * data_degree());
  one.steps = 3;
  one.save = dir + "/one";
  if (world().rank() == 0) run_training(one, log, nullptr, single.get());
  RunConfig tp = run_config("llama-tiny", p, kTensor, kRowsPerRank);
  tp.policy.zero_stage = GetParam();
  tp.steps = 3;
  tp.save = dir + "/tp";
  test::run_on_world(tp);
  world().barrier();
  if (world().rank() == 0) {
    const SafetensorsReader a(one.save + "/adapter_model.safetensors"), b(tp.save + "/adapter_model.safetensors");
    ASSERT_EQ(a.entries().size(), b.entries().size());
    int saved_whole = 0;
    for (const SafetensorsEntry& e : a.entries()) {
      const SafetensorsEntry* t = b.find(e.name);
      ASSERT_NE(t, nullptr) << e.name;
      ASSERT_EQ(t->shape, e.shape) << e.name;
      std::vector<float> x(size_t(e.shape.numel())), y(x.size());
      a.read_f32(e.name, e.shape, x.data());
      b.read_f32(e.name, e.shape, y.data());
      double err = 0, scale = 0;
      for (size_t i = 0; i < x.size(); ++i) {
        err = std::max(err, double(std::fabs(x[i] - y[i])));
        scale = std::max(scale, double(std::fabs(x[i])));
      }
      // Adam divides by the root of the second moment: an element whose gradients are at
      // rounding level moves by whatever their rounding gives (a misplaced slice would be off by
      // its whole size).
      EXPECT_LE(err, 1e-3 * scale) << e.name;
      saved_whole += e.name.find("lora_") == std::string::npos;
    }
    EXPECT_EQ(saved_whole, 6);  // lm_head, norm, and two norms in each of llama-tiny's 2 layers
  }
  // Continue from each adapter (its settings come from the file).
  auto continued = [&](RunConfig c, const std::string& adapter) {
    c.save.clear();
    c.policy.lora = LoraPolicy{};
    c.load_adapter = adapter;
    return c;
  };
  const Trajectory want = trajectory_of(run_training(continued(one, one.save), log, nullptr, single.get()));
  const test::WorldRun got = test::run_on_world(continued(tp, tp.save));
  ASSERT_EQ(got.loss.size(), want.loss.size());
  for (size_t i = 0; i < want.loss.size(); ++i)
    EXPECT_NEAR(got.loss[i], want.loss[i], 1e-5 * want.loss[i]) << "step " << i + 1;
  world().barrier();
  if (world().rank() == 0) std::filesystem::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(ZeroStages, TensorParallelAdapter, ::testing::Values(0, 3),
                         [](const auto& info) { return "zero" + std::to_string(info.param); });

}  // namespace
}  // namespace memfit

int main(int argc, char** argv) { return memfit::test::run_mpi_tests(argc, argv); }
