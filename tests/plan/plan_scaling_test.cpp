// Planning time grows linearly with depth. Planning a 3,000-layer model once took 54 s:
// plan_memory added each persistent buffer's bytes op by op into the timeline (buffers x ops),
// autodiff scanned every parameter per gradient, the ZeRO pass scanned every bucket at every op,
// and --optimizer-in-backward copied the grouped update's per-parameter lists into every
// single-parameter copy (past 24 GB at 3,000 layers).
//
// The test measures no fixed time (the machine running it is shared): it prepares the same run
// at 500 and at 2,000 layers in one process and compares. Four times the layers gives four
// times the ops; a linear planner takes about four times as long, a quadratic one sixteen
// times. The bound is the geometric middle, 8. Time is this process's CPU time, not wall
// clock (other processes on a loaded machine delay the wall clock, not the CPU time), the
// fastest of three tries per size. An address-space limit makes
// a quadratic memory regression fail with bad_alloc instead of taking the machine's memory.
#include <gtest/gtest.h>
#include <sys/resource.h>

#include <algorithm>
#include <ctime>
#include <cstdio>
#include <string>
#include <vector>

#include "kernels/backend.hpp"
#include "support/run_cli.hpp"
#include "train/trainer.hpp"

namespace memfit {
namespace {

constexpr rlim_t kAddressSpaceLimit = rlim_t(16) << 30;
constexpr int64_t kSmall = 500, kLarge = 2000;
constexpr double kMaxTimeRatio = 8;  // linear: 4; quadratic: 16

struct Variant {
  std::string name;
  void (*apply)(RunConfig&);
};

const std::vector<Variant>& variants() {
  static const std::vector<Variant> v = {
      {"fp32", [](RunConfig&) {}},
      {"optimizer in backward", [](RunConfig& c) { c.policy.update_in_backward = true; }},
      {"bf16, ZeRO-3 on 2 ranks",
       [](RunConfig& c) {
         c.policy.precision = Precision::bf16;
         c.policy.zero_stage = 3;
         c.topology.data = 2;
       }},
      {"fp16, selective recompute, ZeRO-1 on 2 ranks, accumulation",
       [](RunConfig& c) {
         c.policy.precision = Precision::fp16;
         c.policy.recompute = parse_recompute("selective:attention,norms");
         c.policy.zero_stage = 1;
         c.policy.grad_accum = 2;
         c.topology.data = 2;
       }},
  };
  return v;
}

double cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return double(t.tv_sec) + 1e-9 * double(t.tv_nsec);
}

struct Measured {
  size_t ops = 0;
  double seconds = 0;
};

Measured prepare(int64_t layers, const Variant& v, const Backend& backend) {
  const std::string config = test::temp_dir() + "/deep" + std::to_string(layers) + ".json";
  test::write_file(config, R"({"model_type": "gpt2", "n_layer": )" + std::to_string(layers) +
                               R"(, "n_head": 4, "n_embd": 128, "vocab_size": 256, "n_positions": 256})");
  RunConfig c;
  c.model = config;
  c.policy.batch = 4;
  c.policy.seq = 64;
  v.apply(c);
  Measured m{0, 1e30};
  for (int attempt = 0; attempt < 3; ++attempt) {
    const double t0 = cpu_seconds();
    const PreparedRun run = prepare_run(c, backend);
    m.seconds = std::min(m.seconds, cpu_seconds() - t0);
    m.ops = run.compiled.program.ops().size();
    // The plan is a real one: its timeline at the peak sums to its categories.
    const TierPlan& t = run.compiled.plan.tier(Tier::device);
    uint64_t at_peak = 0;
    for (uint64_t b : t.at_peak) at_peak += b;
    EXPECT_EQ(at_peak, t.live_bytes[size_t(t.peak_op)]) << v.name;
    EXPECT_EQ(at_peak + t.free_at_peak, t.peak_bytes) << v.name;
  }
  return m;
}

TEST(PlanScaling, PlanningTimeGrowsLinearlyWithTheLayerCount) {
  rlimit limit{kAddressSpaceLimit, kAddressSpaceLimit};
  ASSERT_EQ(setrlimit(RLIMIT_AS, &limit), 0);
  auto backend = make_cpu_backend();
  for (const Variant& v : variants()) {
    const Measured small = prepare(kSmall, v, *backend), large = prepare(kLarge, v, *backend);
    const double op_ratio = double(large.ops) / double(small.ops), time_ratio = large.seconds / small.seconds;
    std::printf("%s: %lld layers %zu ops in %.3f s, %lld layers %zu ops in %.3f s: ops x%.2f, time x%.2f\n",
                v.name.c_str(), (long long)kSmall, small.ops, small.seconds, (long long)kLarge, large.ops,
                large.seconds, op_ratio, time_ratio);
    // The program itself is linear in depth (the premise of comparing times).
    EXPECT_GT(op_ratio, 3.5) << v.name;
    EXPECT_LT(op_ratio, 4.1) << v.name;
    EXPECT_LT(time_ratio, kMaxTimeRatio) << v.name;
  }
}

// A model far beyond any bound is refused before anything is built: no memory, no time.
TEST(PlanScaling, ABillionLayersAreRefusedBeforeAnythingIsBuilt) {
  rlimit limit{kAddressSpaceLimit, kAddressSpaceLimit};
  ASSERT_EQ(setrlimit(RLIMIT_AS, &limit), 0);
  const std::string config = test::temp_dir() + "/billion.json";
  test::write_file(config, R"({"model_type": "gpt2", "n_layer": 1000000000, "n_head": 4, "n_embd": 128,
                               "vocab_size": 256, "n_positions": 256})");
  for (const char* command : {"plan --model ", "train --steps 1 --model "}) {
    const test::CliResult r = test::run_memfit(command + config);
    EXPECT_EQ(r.status, 1) << command;
    EXPECT_NE(r.err.find("n_layer 1000000000 exceeds 10000 layers"), std::string::npos) << r.err;
  }
}

}  // namespace
}  // namespace memfit
