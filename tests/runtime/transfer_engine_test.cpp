// The transfer engine (runtime/transfer_engine.hpp) on both backends: a tensor goes device ->
// host -> disk -> host -> device through transfer ops, some started and waited for with a
// compute op running in between, and comes back bit for bit; every tier's measured high-water
// mark equals its planned peak (the disk tier's: the highest byte written into its file);
// steps allocate nothing; and a disk tier without a directory, or a file made unwritable behind
// the engine's back, gives one clear error instead of a crash or a hang.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <numeric>
#include <vector>

#include "kernels/backend.hpp"
#include "memory/disk_file.hpp"
#include "runtime/compile.hpp"
#include "runtime/executor.hpp"
#include "support/alloc_counter.hpp"
#include "support/hand_built.hpp"
#include "support/run_cli.hpp"

namespace memfit {
namespace {

constexpr int64_t kFloats = 4096;  // 16 KiB: a whole number of the disk tier's 4 KiB pages

struct RoundTrip {
  Program program;
  TensorId source, back, other;
};

// source (device) -> host_a -> disk -> host_b -> back (device). The first three transfers are
// started and waited for, with a compute op (a fill of `other`) running while the first moves;
// the last runs within its op.
RoundTrip round_trip_program() {
  RoundTrip r;
  Program& p = r.program;
  auto tensor = [&](const std::string& name, Tier tier) {
    TensorDesc d;
    d.name = name;
    d.shape = Shape{kFloats};
    d.tier = tier;
    d.lifetime = Lifetime::persistent;
    return p.add_tensor(std::move(d));
  };
  r.source = tensor("source", Tier::device);
  const TensorId host_a = tensor("host_a", Tier::host), disk = tensor("disk", Tier::disk);
  const TensorId host_b = tensor("host_b", Tier::host);
  r.back = tensor("back", Tier::device);
  r.other = tensor("other", Tier::device);
  auto started = [&](const std::string& name, TensorId from, TensorId to, int id) {
    Op start;
    start.kind = OpKind::transfer;
    start.phase = Phase::transfer;
    start.name = name;
    start.inputs = {from};
    start.outputs = {to};
    start.modes = {WriteMode::overwrite};
    start.async_id = id;
    const int at = p.add_op(start);
    Op wait = p.op(at);
    wait.kind = OpKind::wait;
    wait.name = name + ".wait";
    wait.modes = {WriteMode::update};
    return wait;
  };
  p.begin_section(SectionKind::micro);
  const Op wait_out = started("to_host", r.source, host_a, 0);
  Op fill;
  fill.kind = OpKind::fill;
  fill.name = "compute_meanwhile";
  fill.outputs = {r.other};
  fill.modes = {WriteMode::overwrite};
  fill.attrs = FillAttrs{2.5f};
  p.add_op(fill);
  p.add_op(wait_out);
  p.add_op(started("to_disk", host_a, disk, 1));
  p.add_op(started("from_disk", disk, host_b, 2));
  test::add_plain_op(p, OpKind::transfer, "to_device", {host_b}, {r.back});
  p.end_section();
  return r;
}

std::vector<float> pattern() {
  std::vector<float> v(kFloats);
  for (int64_t i = 0; i < kFloats; ++i) v[size_t(i)] = float(i) * 0.37f - 100.0f + float(i % 7) * 1e-3f;
  return v;
}

class TransferEngineOn : public ::testing::TestWithParam<const char*> {};

TEST_P(TransferEngineOn, RoundTripIsBitwiseWithEveryTierMeasuredAsPlanned) {
  const auto backend = make_backend(GetParam());
  RoundTrip r = round_trip_program();
  const CompiledProgram c = compile_program(r.program, *backend);
  for (Tier t : kAllTiers) EXPECT_GT(c.plan.tier(t).peak_bytes, 0u) << tier_name(t);
  const std::string dir = test::temp_dir();
  Executor ex(c, *backend, nullptr, ExecutorOptions{BufferSite{dir, 0}});
  const std::vector<float> values = pattern();
  ex.write_as<float>(r.source, values);
  StepContext ctx;
  ex.run_section(SectionKind::micro, ctx);  // warm-up: the workers' first wake-ups
  test::alloc_counter_start();
  for (int i = 0; i < 3; ++i) ex.run_section(SectionKind::micro, ctx);
  const test::AllocCounts counts = test::alloc_counter_stop();
  EXPECT_EQ(counts.memfit_allocations, 0);
  std::vector<float> back(kFloats), other(kFloats);
  ex.read_as<float>(r.back, back);
  ex.read_as<float>(r.other, other);
  EXPECT_EQ(std::memcmp(back.data(), values.data(), values.size() * 4), 0);
  EXPECT_EQ(other, std::vector<float>(kFloats, 2.5f));
  for (Tier t : kAllTiers)
    EXPECT_EQ(ex.buffer(t).measured_high_water(), c.plan.tier(t).peak_bytes) << tier_name(t);
  EXPECT_EQ(ex.buffer(Tier::disk).host_data(), nullptr);  // the disk tier is a file, not memory
}

INSTANTIATE_TEST_SUITE_P(Backends, TransferEngineOn, ::testing::Values("cpu", "reference"));

TEST(TransferEngine, ADiskTierNeedsADirectory) {
  const auto backend = make_backend("cpu");
  RoundTrip r = round_trip_program();
  const CompiledProgram c = compile_program(r.program, *backend);
  const std::string error = test::error_of([&] { Executor ex(c, *backend); });
  EXPECT_NE(error.find("disk tier"), std::string::npos) << error;
  EXPECT_NE(error.find("--offload-dir"), std::string::npos) << error;
}

TEST(TransferEngine, OnlyTransfersMayTouchTheDiskTier) {
  const auto backend = make_backend("cpu");
  RoundTrip r = round_trip_program();
  Program& p = r.program;
  const TensorId disk = p.find_tensor("disk");
  p.begin_section(SectionKind::optimizer);
  Op fill;
  fill.kind = OpKind::fill;
  fill.name = "fill_on_disk";
  fill.outputs = {disk};
  fill.modes = {WriteMode::overwrite};
  p.add_op(fill);
  p.end_section();
  const CompiledProgram c = compile_program(p, *backend);
  const std::string error =
      test::error_of([&] { Executor ex(c, *backend, nullptr, ExecutorOptions{BufferSite{test::temp_dir(), 0}}); });
  EXPECT_NE(error.find("fill_on_disk"), std::string::npos) << error;
  EXPECT_NE(error.find("only transfers"), std::string::npos) << error;
}

TEST(TransferEngine, AFailingDiskIsReportedByTheWaitNotACrashOrAHang) {
  const auto backend = make_backend("cpu");
  RoundTrip r = round_trip_program();
  const CompiledProgram c = compile_program(r.program, *backend);
  const std::string dir = test::temp_dir() + "/failing";
  std::filesystem::create_directories(dir);
  Executor ex(c, *backend, nullptr, ExecutorOptions{BufferSite{dir, 0}});
  ex.write_as<float>(r.source, pattern());
  // The tier's file descriptor turns read-only behind the engine's back (as a disk gone
  // read-only would): the write of `to_disk`, on the worker thread, fails.
  const auto& file = dynamic_cast<const DiskFile&>(ex.buffer(Tier::disk));
  const int read_only = ::open("/dev/null", O_RDONLY);
  ASSERT_GE(read_only, 0);
  ASSERT_EQ(::dup2(read_only, file.fd()), file.fd());
  if (file.direct_fd() >= 0) {
    ASSERT_EQ(::dup2(read_only, file.direct_fd()), file.direct_fd());
  }
  ::close(read_only);
  const std::string error = test::error_of([&] { ex.run_section(SectionKind::micro, StepContext{}); });
  EXPECT_NE(error.find("[io] transfer 'to_disk' failed"), std::string::npos) << error;
  EXPECT_NE(error.find("cannot write"), std::string::npos) << error;
  EXPECT_EQ(error.find('\n'), std::string::npos) << error;
}

}  // namespace
}  // namespace memfit
