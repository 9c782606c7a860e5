// `memfit plan --framework deepspeed` against DeepSpeed's own steps: the per-rank CPU
// tensor-byte peak of one steady-state ZeRO step of an HF model, measured on DeepSpeed 0.19.8's
// CPU accelerator by tools/make_deepspeed_memory_fixtures.py (tests/fixtures/deepspeed_memory).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>

#include <nlohmann/json.hpp>

#include "core/error.hpp"
#include "fit/fit_search.hpp"
#include "fit/framework_deepspeed.hpp"
#include "fit/hardware.hpp"
#include "support/run_cli.hpp"

#include "support/hf_json_spec.hpp"

namespace memfit {
namespace {

nlohmann::json fixtures() {
  std::ifstream f(std::string(MEMFIT_FIXTURE_DIR) + "/deepspeed_memory/fixtures.json");
  EXPECT_TRUE(f.good());
  nlohmann::json all = nlohmann::json::parse(f);
  EXPECT_EQ(all.at("deepspeed"), "0.19.8");
  nlohmann::json configs = all.at("fixtures");
  EXPECT_GE(configs.size(), 16u);
  return configs;
}

ModelSpec spec_of(const nlohmann::json& c) { return test::spec_of_hf_json(c); }

// The step the tool ran: its DeepSpeed config, read as `--deepspeed-config` reads one.
DeepSpeedStep step_of(const nlohmann::json& r) {
  DeepSpeedStep st;
  st.torch.seq = r.at("seq");
  st.torch.attention = TorchAttention::sdpa;
  st.world = r.at("world");
  nlohmann::json ds = {{"train_micro_batch_size_per_gpu", r.at("batch")},
                       {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 1e-4}, {"torch_adam", true}}}}},
                       {"zero_optimization", r.at("zero_optimization")}};
  ds["zero_optimization"]["stage"] = r.at("stage");
  if (r.at("precision") != "fp32") ds[r.at("precision").get<std::string>()] = {{"enabled", true}};
  apply_deepspeed_json(ds, st);
  return st;
}

// The largest rank's peak as an interval: the profiler sees the main thread only, and a rank's
// count may be high by the frees it missed (over_bytes) or low by the allocations it missed
// (under_bytes); both are 0 where nothing crossed threads.
std::pair<double, double> measured_interval(const nlohmann::json& r) {
  double lo = 0, hi = 0;
  for (size_t i = 0; i < r.at("peak_bytes").size(); ++i) {
    const double peak = r.at("peak_bytes").at(i).get<double>();
    lo = std::max(lo, peak - r.at("over_bytes").at(i).get<double>());
    hi = std::max(hi, peak + r.at("under_bytes").at(i).get<double>());
  }
  return {lo, hi};
}

TEST(FrameworkDeepspeed, TensorListIsHfs) {
  // The per-tensor list stage 3's persistence threshold is applied to sums to HF's count.
  for (const auto& r : fixtures()) {
    const ModelSpec s = spec_of(r.at("model"));
    const DeepSpeedStep st = step_of(r);
    DeepSpeedStep zero0 = st;
    zero0.zero.stage = 0, zero0.precision = DsPrecision::fp32, zero0.world = 1;
    EXPECT_EQ(predict_deepspeed_peak(s, zero0).parameters, uint64_t(4 * torch_parameters(s).elements));
  }
}

// Tolerance: the rest of a step is HF's activations, taken from the PyTorch prediction: exact
// in fp32; for a bf16/fp16 model the bf16 autocast step's, which keeps a few tensors in fp32 that
// a half-precision model keeps in half (up to 4% of these small models' peaks, where
// activations are most of it). DeepSpeed also keeps a few activation-sized tensors past a step on
// some ranks (a reference held until the next step), not modelled: under 2% here. Stage 3's
// gathered parameters are modelled whole, not per module in DeepSpeed's trace order.
TEST(FrameworkDeepspeed, PeakNearDeepspeeds) {
  int n = 0;
  for (const auto& r : fixtures()) {
    const ModelSpec s = spec_of(r.at("model"));
    const DeepSpeedStep st = step_of(r);
    const DeepSpeedPeak p = predict_deepspeed_peak(s, st);
    const auto [lo, hi] = measured_interval(r);
    const double tolerance = 0.05, pred = double(p.peak);
    EXPECT_GE(pred, lo * (1 - tolerance)) << "fixture " << n << " (" << p.where << "), measured " << lo << "-" << hi;
    EXPECT_LE(pred, hi * (1 + tolerance)) << "fixture " << n << " (" << p.where << "), measured " << lo << "-" << hi;
    const double off = pred < lo ? pred / lo - 1 : pred > hi ? pred / hi - 1 : 0;
    std::printf("fixture %2d: stage %d world %d %-4s predicted %12llu measured %12.0f-%12.0f off %+.4f\n", n,
                st.zero.stage, st.world, r.at("precision").get<std::string>().c_str(), (unsigned long long)p.peak, lo,
                hi, off);
    ++n;
  }
}

// Where the peak is before the first gradient, an fp32 step at stage 0 or 2 is the PyTorch
// step's activations plus closed-form state, both exact: a mistake in the state (a missing copy,
// a partition of the wrong size) shows as a byte count, not a percentage. (Stage 1 on two ranks
// measured 0.3-0.5% above: the reduce bucket or a gradient already live there on one rank.)
TEST(FrameworkDeepspeed, Fp32BeforeTheFirstGradientWithin64Bytes) {
  int checked = 0;
  for (const auto& r : fixtures()) {
    if (r.at("precision") != "fp32" || (r.at("stage") != 0 && r.at("stage") != 2)) continue;
    const ModelSpec s = spec_of(r.at("model"));
    const DeepSpeedPeak p = predict_deepspeed_peak(s, step_of(r));
    const uint64_t m = uint64_t(measured_interval(r).first);  // less the frees the profiler missed
    if (p.where != "backward, before the first gradient") continue;
    EXPECT_LE(std::max(p.peak, m) - std::min(p.peak, m), 64u) << "predicted " << p.peak << ", measured " << m;
    ++checked;
  }
  EXPECT_GE(checked, 2);
}

TEST(FrameworkDeepspeed, DefaultsAreDeepspeeds) {
  DeepSpeedStep st;
  apply_deepspeed_json(nlohmann::json{{"zero_optimization", {{"stage", 3}}}}, st);
  EXPECT_EQ(st.zero.reduce_bucket_size, 500000000);
  EXPECT_EQ(st.zero.prefetch_bucket_size, 50000000);
  EXPECT_EQ(st.zero.param_persistence_threshold, 100000);
  EXPECT_EQ(st.zero.max_live_parameters, 1000000000);
  EXPECT_TRUE(st.zero.overlap());  // on by default at stage 3 only
  apply_deepspeed_json(nlohmann::json{{"zero_optimization", {{"stage", 2}, {"reduce_bucket_size", 2e8}}}}, st);
  EXPECT_FALSE(st.zero.overlap());
  EXPECT_EQ(st.zero.reduce_bucket_size, 200000000);
  EXPECT_THROW(apply_deepspeed_json(nlohmann::json{{"zero_optimization", {{"stage", 4}}}}, st), Error);
  EXPECT_THROW(apply_deepspeed_json(nlohmann::json{{"zero_optimization", {{"overlap_comm", 1}}}}, st), Error);
  EXPECT_THROW(apply_deepspeed_json(
                   nlohmann::json{{"zero_optimization", {{"offload_optimizer", {{"device", "cpu"}}}}}}, st),
               Error);
}

// Buckets are per configured size: the reduce bucket doubles with overlap_comm, and at stage 2
// a larger bucket moves the peak to the first gradient by exactly the bucket's growth.
TEST(FrameworkDeepspeed, BucketsFollowTheConfig) {
  const ModelSpec s = spec_of(fixtures().at(0).at("model"));
  DeepSpeedStep st;
  st.torch.batch = 2, st.torch.seq = 128, st.world = 2, st.precision = DsPrecision::bf16, st.zero.stage = 2;
  st.zero.reduce_bucket_size = 100'000'000;
  const DeepSpeedPeak one = predict_deepspeed_peak(s, st);
  st.zero.overlap_comm = true;
  const DeepSpeedPeak two = predict_deepspeed_peak(s, st);
  EXPECT_EQ(two.peak - one.peak, 2u * 100'000'000u);  // a second bf16 bucket
  EXPECT_EQ(two.buckets, 2u * 2u * 100'000'000u);
  // ZeRO partitions the master and the moments: 12 bytes a parameter over N ranks.
  DeepSpeedStep four = st;
  four.world = 4;
  const DeepSpeedPeak p2 = predict_deepspeed_peak(s, st), p4 = predict_deepspeed_peak(s, four);
  const double P = double(torch_parameters(s).elements);
  EXPECT_NEAR(double(p2.master + p2.optimizer_state) - double(p4.master + p4.optimizer_state), 12 * P / 4, 16);
}

TEST(FrameworkDeepspeed, PlanCliPrintsAndWritesJson) {
  const std::string dir = test::temp_dir();
  const std::string model = dir + "/ds_gpt2.json", config = dir + "/ds_config.json";
  test::write_file(model, R"({"model_type":"gpt2","n_layer":2,"n_embd":128,"n_head":4,"vocab_size":2000,)"
                          R"("n_positions":1024})");
  test::write_file(config, R"({"bf16":{"enabled":true},"zero_optimization":{"stage":2,"reduce_bucket_size":100000}})");
  const std::string common = "plan --model " + model + " --batch 2 --seq 128 --framework deepspeed --world-size 2";
  const test::CliResult text = test::run_memfit(common + " --deepspeed-config " + config);
  ASSERT_EQ(text.status, 0) << text.err;
  EXPECT_NE(text.out.find("ZeRO-2"), std::string::npos) << text.out;
  EXPECT_NE(text.out.find("fp32 master"), std::string::npos) << text.out;
  const test::CliResult js = test::run_memfit(common + " --deepspeed-config " + config + " --json");
  ASSERT_EQ(js.status, 0) << js.err;
  const nlohmann::json j = nlohmann::json::parse(js.out).at("deepspeed");
  EXPECT_EQ(j.at("zero_optimization").at("reduce_bucket_size"), 100000);
  EXPECT_EQ(j.at("precision"), "bf16");
  uint64_t sum = 0;
  for (const auto& [k, v] : j.at("breakdown").items()) sum += v.get<uint64_t>();
  EXPECT_EQ(sum, j.at("peak_bytes").get<uint64_t>());
  // The same step from memfit's own flags: DeepSpeed's default buckets.
  const test::CliResult flags = test::run_memfit(common + " --zero 2 --precision bf16 --json");
  ASSERT_EQ(flags.status, 0) << flags.err;
  EXPECT_EQ(nlohmann::json::parse(flags.out).at("deepspeed").at("zero_optimization").at("reduce_bucket_size"),
            500000000);
}

// --fit --framework deepspeed: GPT-2 (124M) at sequence 1024 on two RTX 4090s. Every winner's
// bytes are the DeepSpeed prediction of its step (the candidate's stage, precision and
// micro-batch under the configured buckets) plus the fixed runtime bytes, within the budget less
// 10%; one more micro-batch does not fit; what the prediction does not model is skipped.
TEST(FrameworkDeepspeed, FitJudgesByTheDeepspeedPeak) {
  Cluster c;
  c.hw = hardware_preset("rtx4090-24gb");
  c.gpus_per_node = 2;
  Policy base;
  base.seq = 1024;
  const ModelSpec spec = model_preset("gpt2");
  FitOptions o;
  o.framework = FitFramework::deepspeed;
  o.headroom = 0.10;
  o.keep = 100;
  o.deepspeed_zero.reduce_bucket_size = 200'000'000;
  const uint64_t usable = usable_bytes(c.hw.memory_bytes, o.headroom);
  const FitResult r = fit_search(spec, base, c, {}, o);
  ASSERT_FALSE(r.ranked.empty());
  auto bytes = [&](const Policy& p) {
    std::string why;
    std::optional<DeepSpeedStep> st = fit_deepspeed_step(p, 2, o, why);
    EXPECT_TRUE(st.has_value()) << why;
    EXPECT_EQ(st->zero.reduce_bucket_size, 200'000'000);
    // On the GPU preset: CUDA's activations with both threads' cuBLAS workspaces, and the
    // runtime's other fixed bytes.
    st->torch.cuda = true, st->torch.cublas_workspace_bytes = c.hw.gemm_workspace_bytes;
    return predict_deepspeed_peak(spec, *st).peak + c.fixed_overhead_bytes() - c.hw.gemm_workspace_bytes;
  };
  for (const FitCandidate& f : r.ranked) {
    EXPECT_EQ(f.framework_bytes, bytes(f.policy)) << f.family;
    EXPECT_LE(f.framework_bytes, usable) << f.family;
  }
  const FitCandidate& w = r.ranked.front();
  Policy more = w.policy;
  ++more.batch;
  if (w.policy.batch < o.max_batch) EXPECT_GT(bytes(more), usable) << w.family;
  EXPECT_GT(r.skipped.at("8-bit AdamW"), 0);
}

}  // namespace
}  // namespace memfit
