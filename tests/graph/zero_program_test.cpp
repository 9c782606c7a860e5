// The ZeRO pass planned for every rank of N-rank worlds without launching them (no MPI): the
// per-rank model-state bytes against the ZeRO paper's formulas for Psi parameters and N ranks
// plus the padding the layout lists, the shard layout (pieces partition every parameter,
// 8-bit blocks never straddle ranks), the bytes each stage communicates against 2Psi / 2Psi /
// 2Psi elements, and the refusals.
//
// Model state of one rank, by category (bp, bg: bytes of a parameter and of a gradient
// element; Psi_p: parameters with the layout's padding; s_r: elements of rank r's pieces, at
// most Psi_p / N, summing to Psi over the ranks):
//   stage 1: bp Psi_p + bg Psi_p + 4 s_r (fp32 masters, 16-bit runs only) + 8 s_r (m, v)
//   stage 2: bp Psi_p + bg Psi_p / N + the same masters and moments
//   stage 3: bp Psi_p / N + bg Psi_p / N + the same masters and moments
// i.e. fp32: 8Psi + 8Psi/N, 4Psi + 12Psi/N, 16Psi/N; bf16 weights and gradients with fp32
// masters and moments: 4Psi + 12Psi/N, 2Psi + 14Psi/N, 16Psi/N; bf16 weights with fp32
// gradients (derived the same way): 6Psi + 12Psi/N, 2Psi + 16Psi/N, 18Psi/N. The gradient
// shards count as model state although with one micro-step they are step-transient (they
// live from the reduce-scatter to the update, so the peak, at the start of the backward,
// holds none of them). The full-size
// gradients of stages 2 and 3 (one block at a time) are transient buffers (zero.grads.*),
// and stage 3's gathered parameters (zero.gather.*, forward and backward copies, one or two
// blocks live at a time) are communication buffers: both listed apart.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>

#include "core/error.hpp"
#include "graph/forward_rewrite.hpp"
#include "graph/optimizer.hpp"
#include "graph/training_program.hpp"
#include "graph/zero.hpp"
#include "plan/memory_plan.hpp"
#include "support/run_cli.hpp"
#include "kernels/backend.hpp"

namespace memfit {
namespace {

Policy policy(int stage, Precision precision = Precision::fp32, DType grad = DType::f32,
              OptimizerKind opt = OptimizerKind::adamw) {
  Policy p;
  p.batch = 1;
  p.seq = 16;
  p.zero_stage = stage;
  p.precision = precision;
  p.grad_dtype = grad;
  p.optimizer = opt;
  p.with_eval = false;
  return p;
}

struct ModelState {
  uint64_t params = 0, grads = 0, masters = 0, state = 0, grad_buffers = 0, gather_buffers = 0;
  int64_t padded = 0;  // Psi_p: elements of the parameter buckets
  int buckets = 0;
};

ModelState model_state(const Program& p, int stage, int world) {
  ModelState m;
  for (const TensorDesc& t : p.tensors()) {
    if (t.is_view()) continue;
    switch (t.category) {
      case Category::parameters:
        m.params += t.bytes();
        m.padded += t.numel() * (stage == 3 ? world : 1);  // stage 3 keeps only the shard
        ++m.buckets;
        break;
      case Category::communication: m.gather_buffers += t.name.starts_with("zero.gather.") ? t.bytes() : 0; break;
      case Category::master_weights: m.masters += t.bytes(); break;
      case Category::optimizer_state: m.state += t.bytes(); break;
      case Category::gradients:
        // The shards of stages 2 and 3 are model state even when step-transient (one
        // micro-step: they live from the reduce-scatter to the update).
        (stage >= 2 && t.lifetime == Lifetime::transient && !t.name.starts_with("zero.grad_shard.") ? m.grad_buffers
                                                                                                   : m.grads) +=
            t.bytes();
        break;
      default: break;
    }
  }
  return m;
}

// gpt2-tiny's tensors are multiples of 32 elements and need no padding; this one does.
ModelSpec odd_model() {
  ModelSpec s = model_preset("gpt2-tiny");
  s.name = "gpt2-odd";
  s.n_embd = 40;
  s.n_head = s.n_kv_head = 4;
  s.n_inner = 160;
  return s;
}

int64_t piece_elements(const Program& p) {
  int64_t n = 0;
  for (const ParamEntry& e : p.params()) n += e.shard_numel;
  return n;
}

TEST(ZeroProgram, PerRankModelStateFollowsTheZeroFormulas) {
  for (const ModelSpec& spec : {model_preset("gpt2-tiny"), odd_model()}) {
  struct Case {
    Precision precision;
    DType grad;
  };
  for (const Case c : {Case{Precision::fp32, DType::f32}, Case{Precision::bf16, DType::bf16},
                       Case{Precision::bf16, DType::f32}}) {
    const uint64_t bp = c.precision == Precision::fp32 ? 4 : 2, bg = dtype_bytes(c.grad, 1);
    const uint64_t master = c.precision == Precision::fp32 ? 0 : 4;
    for (int world : {2, 4}) {
      for (int stage : {1, 2, 3}) {
        SCOPED_TRACE(fmt::format("{} grads {}, N = {}, stage {}", precision_name(c.precision), dtype_name(c.grad),
                                 world, stage));
        int64_t total_pieces = 0;
        for (int rank = 0; rank < world; ++rank) {
          const Program p =
              build_training_program(spec, policy(stage, c.precision, c.grad), Topology{.data = world, .rank = rank}, cpu_capabilities());
          const int64_t psi = p.parameter_count();
          const ModelState m = model_state(p, stage, world);
          const int64_t s = piece_elements(p);
          total_pieces += s;
          ASSERT_EQ(m.padded % world, 0);
          EXPECT_LE(s, m.padded / world);
          // Padding: each parameter rounded up to 32 elements, each bucket to N * 32.
          EXPECT_LE(m.padded - psi, int64_t(p.params().size()) * 32 + m.buckets * world * 32);
          EXPECT_EQ(m.params, bp * uint64_t(stage == 3 ? m.padded / world : m.padded));
          EXPECT_EQ(m.grads, bg * uint64_t(stage == 1 ? m.padded : m.padded / world));
          EXPECT_EQ(m.masters, master * uint64_t(s));
          EXPECT_EQ(m.state, 8 * uint64_t(s));
          if (stage >= 2) { EXPECT_EQ(m.grad_buffers, bg * uint64_t(m.padded)); }  // one block live at a time
          if (stage == 3) { EXPECT_EQ(m.gather_buffers, 2 * bp * uint64_t(m.padded)); }  // forward and backward copies
          // The formula in Psi, off by no more than the padding's bytes.
          const double n = world, total = double(m.params + m.grads + m.masters + m.state);
          const double formula = stage == 1   ? double(bp + bg) * psi + double(master + 8) * psi / n
                                 : stage == 2 ? double(bp) * psi + double(bg + master + 8) * psi / n
                                              : double(bp + bg + master + 8) * psi / n;
          // |total - formula| <= (bp + bg)(Psi_p - Psi) + (masters + moments)|s_r - Psi/N|, each
          // difference at most the padding.
          EXPECT_LE(std::abs(total - formula), 20.0 * double(m.padded - psi));
          if (rank == 0)
            std::printf("%s %s grads %s N=%d stage %d: %.0f bytes per rank, formula %.0f (Psi %ld, padded %ld)\n",
                        spec.name.c_str(), std::string(precision_name(c.precision)).c_str(),
                        std::string(dtype_name(c.grad)).c_str(),
                        world, stage, total, formula, long(psi), long(m.padded));
        }
        EXPECT_EQ(total_pieces, build_training_program(spec, policy(0), {}, cpu_capabilities()).parameter_count());
      }
    }
  }
  }
}

TEST(ZeroProgram, PiecesPartitionEveryParameterAndEightBitBlocksStayWhole) {
  const ModelSpec spec = odd_model();
  for (OptimizerKind opt : {OptimizerKind::adamw, OptimizerKind::adamw8bit}) {
    const int world = 4;
    std::map<std::string, std::vector<std::pair<int64_t, int64_t>>> pieces;
    for (int rank = 0; rank < world; ++rank) {
      const Program p =
          build_training_program(spec, policy(1, Precision::fp32, DType::f32, opt), Topology{.data = world, .rank = rank}, cpu_capabilities());
      for (const ParamEntry& e : p.params()) {
        if (e.shard_numel > 0) pieces[e.name].push_back({e.shard_offset, e.shard_numel});
        const bool q8 = e.state.size() == 4;
        if (q8 && e.shard_numel > 0) {
          EXPECT_EQ(e.shard_offset % kQuantBlock, 0) << e.name;
          EXPECT_EQ(p.tensor(e.state[2]).numel(), (e.shard_numel + kQuantBlock - 1) / kQuantBlock) << e.name;
        }
        EXPECT_EQ(p.tensor(e.state[0]).numel(), e.shard_numel) << e.name;  // m (or its codes)
        EXPECT_EQ(p.tensor(e.state[1]).numel(), e.shard_numel) << e.name;  // v
      }
    }
    const Program whole = build_training_program(spec, policy(0), {}, cpu_capabilities());
    for (const ParamEntry& e : whole.params()) {
      auto& list = pieces[e.name];
      std::sort(list.begin(), list.end());
      int64_t at = 0;
      for (auto [off, n] : list) {
        EXPECT_EQ(off, at) << e.name;
        at = off + n;
      }
      EXPECT_EQ(at, whole.tensor(e.value).numel()) << e.name;
    }
  }
}

TEST(ZeroProgram, StagesCommunicateTwoTwoTwoThreePsiElements) {
  // Ring volumes: all-reduce 2 (N-1)/N of the buffer, reduce-scatter and all-gather (N-1)/N
  // each; the loss adds a few bytes. Stages 0..2 move 2 Psi_p elements per step, stage 3
  // 3 Psi_p (two all-gathers and one reduce-scatter).
  const ModelSpec spec = model_preset("gpt2-tiny");
  const int world = 4;
  for (int stage : {0, 1, 2, 3}) {
    const Program p = build_training_program(spec, policy(stage), Topology{.data = world, .rank = 1}, cpu_capabilities());
    const ModelState m = model_state(p, stage, world);
    const double passes = stage == 3 ? 3.0 : 2.0;
    const double expected = passes * 4.0 * double(m.padded) * (world - 1) / world + 2.0 * 4 * (world - 1) / world;
    EXPECT_DOUBLE_EQ(communication_bytes_per_step(p), expected) << "stage " << stage;
  }
}

int first_op(const Program& p, const std::string& name) {
  for (int i = 0; i < int(p.ops().size()); ++i)
    if (p.op(i).name == name) return i;
  return -1;
}

TEST(ZeroProgram, StageThreeGathersEachBlockBeforeUseAndPrefetchesTheNext) {
  const ModelSpec spec = model_preset("gpt2-tiny");
  ASSERT_GE(spec.n_layer, 3);
  const Program p = build_training_program(spec, policy(3), Topology{.data = 2, .rank = 0}, cpu_capabilities());
  for (int l = 0; l + 1 < spec.n_layer; ++l) {
    const int ln = first_op(p, fmt::format("h.{}.ln_1", l));
    const int back = first_op(p, fmt::format("h.{}.mlp.c_proj.bwd_weight", l));
    ASSERT_GE(ln, 0);
    ASSERT_GE(back, 0);
    // Block l's parameters are gathered before its forward; block l+1's too (prefetch).
    EXPECT_LT(first_op(p, fmt::format("zero.all_gather.h{}.forward", l)), ln);
    EXPECT_LT(first_op(p, fmt::format("zero.all_gather.h{}.forward", l + 1)), ln);
    EXPECT_GT(first_op(p, fmt::format("zero.all_gather.h{}.forward", l + 1)),
              first_op(p, fmt::format("zero.all_gather.h{}.forward", l)));
    // Backward runs blocks in reverse: block l's gather comes before its backward, and
    // block l-1's is issued while block l's backward still has to run.
    EXPECT_LT(first_op(p, fmt::format("zero.all_gather.h{}.backward", l)), back);
    if (l > 0) { EXPECT_LT(first_op(p, fmt::format("zero.all_gather.h{}.backward", l - 1)), back); }
    // Forward ops read the forward copy, backward ops the backward copy.
    for (const Op& op : p.ops())
      for (TensorId id : op.inputs) {
        const TensorDesc& t = p.tensor(id);
        if (!t.is_view() || !p.tensor(t.view_of).name.starts_with("zero.gather.")) continue;
        const bool bwd_copy = p.tensor(t.view_of).name.ends_with(".backward");
        EXPECT_EQ(bwd_copy, op.phase == Phase::backward || op.phase == Phase::recompute) << op.name << " " << t.name;
      }
  }
  // The plan holds the gathered blocks as communication buffers.
  const MemoryPlan plan = plan_memory(p);
  EXPECT_GT(plan.tier(Tier::device).at_peak[size_t(Category::communication)], 0u);
}

// Each stage shards more, so with one micro-step no stage may plan a higher per-rank peak
// than the stage before it up to 2 (stage 3 trades gathered blocks for parameter shards, which
// pays off only with more ranks or larger models). The stage-2 gradient shards are
// step-transient with one micro-step and persistent with accumulation.
TEST(ZeroProgram, ShardingMoreNeverRaisesThePeakUpToStageTwo) {
  for (Precision precision : {Precision::fp32, Precision::bf16})
    for (int world : {2, 4}) {
      SCOPED_TRACE(fmt::format("{}, N = {}", precision_name(precision), world));
      uint64_t previous = UINT64_MAX;
      for (int stage : {0, 1, 2}) {
        const Program p =
            build_training_program(model_preset("gpt2-tiny"), policy(stage, precision), Topology{.data = world, .rank = 0}, cpu_capabilities());
        const uint64_t peak = plan_memory(p).tier(Tier::device).peak_bytes;
        EXPECT_LE(peak, previous) << "stage " << stage;
        previous = peak;
      }
      for (int accum : {1, 2}) {
        Policy pol = policy(2, precision);
        pol.grad_accum = accum;
        const Program p = build_training_program(model_preset("gpt2-tiny"), pol, Topology{.data = world, .rank = 0}, cpu_capabilities());
        int shards = 0;
        for (const TensorDesc& t : p.tensors())
          if (t.name.starts_with("zero.grad_shard.")) {
            ++shards;
            EXPECT_EQ(t.lifetime, accum == 1 ? Lifetime::transient : Lifetime::persistent) << t.name;
          }
        EXPECT_GT(shards, 0);
      }
    }
}

// Frozen parameters (--freeze) on every rank of 2- and 4-rank worlds, against the same run
// unfrozen. Oracle: summarize_frozen's closed form (frozen elements x bytes per element of
// master and optimizer state). Masters and state shrink by exactly that on every rank at
// stage 0 (every rank whole) and by exactly that summed over the ranks at stages 1..3 (the
// pieces partition each parameter, and with 8-bit AdamW its quantization blocks). Gradients
// (persistent here: accumulation) shrink by the frozen elements' gradient bytes, divided by
// the world from stage 2, up to the two layouts' padding. No frozen parameter has a gradient,
// master or state tensor; no collective but stage 3's gathers touches one; below stage 3
// every rank keeps it whole, outside the buckets.
TEST(ZeroProgram, FrozenParametersHaveNoGradientMasterOrStateOnAnyRank) {
  struct Case {
    const char* model;
    std::vector<std::string> freeze;
  };
  for (const Case& c : {Case{"gpt2-tiny", {"wte.weight", "wpe.weight", "h.0.*", "h.*.attn.c_attn.*"}},
                        Case{"llama-tiny", {"embed_tokens.weight", "layers.0.*", "layers.*.self_attn.*"}}}) {
    const ModelSpec spec = model_preset(c.model);
    for (Precision precision : {Precision::fp32, Precision::bf16})
      for (OptimizerKind opt : {OptimizerKind::adamw, OptimizerKind::adamw8bit})
        for (int world : {2, 4})
          for (int stage : {0, 1, 2, 3}) {
            SCOPED_TRACE(fmt::format("{} {} {}, N = {}, stage {}", c.model, precision_name(precision),
                                     opt == OptimizerKind::adamw ? "adamw" : "adamw8bit", world, stage));
            Policy full = policy(stage, precision, DType::f32, opt);
            full.grad_accum = 2;  // persistent gradients at every stage
            Policy part = full;
            part.freeze = c.freeze;
            FrozenSummary closed;
            int64_t masters_drop = 0, state_drop = 0;
            for (int rank = 0; rank < world; ++rank) {
              const Topology topo{.data = world, .rank = rank};
              const Program f = build_training_program(spec, full, topo, cpu_capabilities());
              const Program q = build_training_program(spec, part, topo, cpu_capabilities());
              if (rank == 0) {
                closed = summarize_frozen(q, part);
                ASSERT_GT(closed.elements, 0);
                (void)plan_memory(q);  // every tensor used, the plan exact (measured in tests/train/freeze_zero_mpitest)
              }
              const ModelState mf = model_state(f, stage, world), mq = model_state(q, stage, world);
              masters_drop += int64_t(mf.masters) - int64_t(mq.masters);
              state_drop += int64_t(mf.state) - int64_t(mq.state);
              if (stage == 0) {
                EXPECT_EQ(int64_t(mf.masters - mq.masters), closed.master_bytes);
                EXPECT_EQ(int64_t(mf.state - mq.state), closed.optimizer_bytes);
              }
              const int64_t padding = (mf.padded - f.parameter_count()) + (mq.padded - q.parameter_count());
              const int64_t grads_drop = int64_t(mf.grads) - int64_t(mq.grads);
              const int64_t expected = closed.gradient_bytes / (stage >= 2 ? world : 1);
              EXPECT_LE(std::abs(grads_drop - expected), 4 * padding) << "gradient bytes " << grads_drop;
              for (const ParamEntry& e : q.params()) {
                if (e.trainable) continue;
                EXPECT_EQ(e.grad, kNoTensor) << e.name;
                EXPECT_EQ(e.master, kNoTensor) << e.name;
                EXPECT_TRUE(e.state.empty()) << e.name;
                const TensorDesc& home = q.tensor(q.root_of(e.value));
                if (stage < 3) {
                  EXPECT_FALSE(q.tensor(e.value).is_view()) << e.name;
                  EXPECT_TRUE(e.whole_state()) << e.name;
                } else {
                  EXPECT_TRUE(home.name.ends_with(".frozen.forward")) << e.name << " in " << home.name;
                }
              }
              for (const Op& op : q.ops()) {
                if (!is_collective_kind(op.kind)) continue;
                const bool frozen = op.name.find(".frozen") != std::string::npos;
                EXPECT_TRUE(!frozen || (stage == 3 && op.kind == OpKind::all_gather)) << op.name;
              }
            }
            EXPECT_EQ(masters_drop, closed.master_bytes * (stage == 0 ? world : 1));
            EXPECT_EQ(state_drop, closed.optimizer_bytes * (stage == 0 ? world : 1));
            if (precision == Precision::bf16) { EXPECT_GT(closed.master_bytes, 0); }
          }
  }
}

TEST(ZeroProgram, WorldOfOneAtStageZeroIsUntouched) {
  const ModelSpec spec = model_preset("gpt2-tiny");
  const Program a = build_training_program(spec, policy(0), {}, cpu_capabilities());
  for (const Op& op : a.ops()) EXPECT_NE(op.phase, Phase::communication) << op.name;
  for (const TensorDesc& t : a.tensors()) EXPECT_FALSE(t.name.starts_with("zero.")) << t.name;
}

TEST(ZeroProgram, RefusesWhatItCannotBuild) {
  const ModelSpec spec = model_preset("gpt2-tiny");
  EXPECT_THROW(build_training_program(spec, policy(4), Topology{.data = 2, .rank = 0}, cpu_capabilities()), Error);
  EXPECT_THROW(build_training_program(spec, policy(5), Topology{.data = 2, .rank = 0}, cpu_capabilities()), Error);
  EXPECT_THROW(build_training_program(spec, policy(1), Topology{.data = 0, .rank = 0}, cpu_capabilities()), Error);
  EXPECT_THROW(build_training_program(spec, policy(1), Topology{.data = 2, .rank = 2}, cpu_capabilities()), Error);
}

// ZeRO in a tensor-parallel topology (data 2 x tensor 2, each tensor rank holding the whole
// model until layers are split): ZeRO shards and scales over the data group. Oracle: rank r's
// program is, op for op, the program of data-parallel rank r / 2 in a world of 2 ranks (same
// shards, same scales), except that its collectives name the data group (size 2) and the fp16
// overflow flag is max-reduced over the world of 4. Both are planned to the same bytes.
TEST(ZeroProgram, CollectivesNameTheDataGroupInATensorParallelTopology) {
  const ModelSpec spec = model_preset("gpt2-tiny");
  for (int stage : {1, 2, 3})
    for (Precision precision : {Precision::fp32, Precision::fp16})
      for (int rank = 0; rank < 4; ++rank) {
        SCOPED_TRACE(fmt::format("stage {}, {}, rank {} of data 2 x tensor 2", stage, precision_name(precision), rank));
        const Topology topo{.data = 2, .tensor = 2, .rank = rank};
        ASSERT_EQ(topo.data_rank(), rank / 2);
        ASSERT_EQ(topo.tensor_rank(), rank % 2);
        const Policy pol = policy(stage, precision, DType::f32);
        const Program p = build_unsplit_training_program(spec, pol, topo, cpu_capabilities());
        const Program data_only = build_training_program(spec, pol, Topology{.data = 2, .rank = rank / 2}, cpu_capabilities());
        ASSERT_EQ(p.ops().size(), data_only.ops().size());
        int collectives = 0, flags = 0;
        for (int i = 0; i < int(p.ops().size()); ++i) {
          const Op& op = p.op(i);
          const Op& expected = data_only.op(i);
          ASSERT_EQ(op.name, expected.name);
          EXPECT_EQ(op.inputs, expected.inputs) << op.name;
          EXPECT_EQ(op.outputs, expected.outputs) << op.name;
          EXPECT_EQ(op.async_id, expected.async_id) << op.name;
          if (const auto* c = std::get_if<ClassifierAttrs>(&op.attrs)) {
            EXPECT_EQ(c->grad_scale, std::get<ClassifierAttrs>(expected.attrs).grad_scale);
            EXPECT_EQ(c->grad_scale, 1.0f / float(c->rows * 2)) << "scaled by the data degree, not the world";
          }
          if (op.kind == OpKind::loss_mean) {
            EXPECT_EQ(std::get<ScaleAttrs>(op.attrs).scale, std::get<ScaleAttrs>(expected.attrs).scale);
          }
          const auto* c = std::get_if<CollectiveAttrs>(&op.attrs);
          if (!c) continue;
          ++collectives;
          if (op.name.starts_with("zero.all_reduce.overflow_flag")) {
            ++flags;
            EXPECT_EQ(c->group, CommGroup::world) << op.name;
            EXPECT_EQ(c->size, 4) << op.name;
          } else {
            EXPECT_EQ(c->group, CommGroup::data) << op.name;
            EXPECT_EQ(c->size, 2) << op.name;
          }
        }
        EXPECT_GT(collectives, 4);
        EXPECT_EQ(flags, precision == Precision::fp16 ? 1 : 0);
        EXPECT_EQ(plan_memory(p).tier(Tier::device).peak_bytes, plan_memory(data_only).tier(Tier::device).peak_bytes);
        for (const TensorDesc& t : p.tensors()) {
          if (t.name.starts_with("zero.grad_shard.")) {
            EXPECT_EQ(t.numel(), data_only.tensor(data_only.find_tensor(t.name)).numel()) << t.name;
          }
        }
      }
}

TEST(ZeroProgram, PlanWorldSizeFromTheCommandLine) {
  const test::CliResult one = test::run_memfit("plan --model gpt2-tiny --batch 1 --seq 16 --zero 2 --world-size 1");
  const test::CliResult four = test::run_memfit("plan --model gpt2-tiny --batch 1 --seq 16 --zero 2 --world-size 4");
  ASSERT_EQ(one.status, 0) << one.err;
  ASSERT_EQ(four.status, 0) << four.err;
  EXPECT_NE(one.out, four.out);
  // On this machine's backend the plan is the real per-rank program, not the hardware estimate.
  EXPECT_NE(four.out.find("data parallel: rank 0 of 4, ZeRO stage 2"), std::string::npos) << four.out;
  EXPECT_EQ(four.out.find("estimate"), std::string::npos) << four.out;
  const test::CliResult bad = test::run_memfit("plan --model gpt2-tiny --zero 4 --world-size 4");
  EXPECT_NE(bad.status, 0);
  EXPECT_NE(bad.err.find("--zero must be an integer in [0, 3]"), std::string::npos) << bad.err;
}

}  // namespace
}  // namespace memfit
