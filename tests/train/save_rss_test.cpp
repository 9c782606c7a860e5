// RSS of `train --save` against the same run without it: saving streams every parameter from
// the executor through the run's bounded staging buffer into the file (train/weights.cpp), so
// it must not add a copy of the weights on top of the planned arena. Before the staging, the
// transposed Conv1D weights alone were copied whole (25 MB here) before the file was written.
// Both runs plan the same arena, so their max RSS differs only by what saving adds. The run's
// own report measures RSS before it saves, so this test reads the children's peak from the
// kernel instead (getrusage(RUSAGE_CHILDREN): the largest child waited for so far): after the
// plain run it is that run's peak, after the saving run the larger of the two.
#include <gtest/gtest.h>

#include <sys/resource.h>

#include <fstream>
#include <string>

#include "support/run_cli.hpp"

namespace memfit {
namespace {

uint64_t children_max_rss() {
  rusage u{};
  getrusage(RUSAGE_CHILDREN, &u);
  return uint64_t(u.ru_maxrss) * 1024;
}

TEST(SaveRss, SavingWeightsAddsNoMoreThanTheStagingToRss) {
  const std::string dir = test::temp_dir();
  // 2 layers, 512 channels, a 32768-token vocabulary: 23.1M parameters, a 92 MB fp32 file,
  // of which the four Conv1D weights per layer are 25 MB.
  const std::string config = dir + "/config.json";
  std::ofstream(config) << R"({"model_type":"gpt2","n_layer":2,"n_head":8,"n_embd":512,"n_positions":64,)"
                           R"("vocab_size":32768})";
  const std::string common = " --model " + config + " --steps 1 --batch 1 --seq 16 --val-fraction 0 --threads 2";
  auto r = test::run_memfit("train" + common);
  ASSERT_EQ(r.status, 0) << r.err;
  const uint64_t plain = children_max_rss();
  ASSERT_GT(plain, uint64_t(350) << 20) << "the run's arena alone is 355 MiB";
  r = test::run_memfit("train" + common + " --save " + dir + "/weights");
  ASSERT_EQ(r.status, 0) << r.err;
  const uint64_t saved = children_max_rss();
  // The staging is 3 MiB; the rest is allocator and file-writer noise.
  constexpr uint64_t kConstant = uint64_t(8) << 20;
  EXPECT_LT(saved, plain + kConstant) << "max RSS " << saved << " with --save, " << plain << " without";
}

}  // namespace
}  // namespace memfit
