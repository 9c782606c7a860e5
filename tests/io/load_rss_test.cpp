// RSS after `train --load` against the same run initialised from its seed: loading a 96 MB
// safetensors file must not keep the file's pages resident on top of the planned arena
// (the reader gives them back as it copies them). Both runs plan the same arena, so their
// max RSS differs only by what loading leaves behind.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "support/run_cli.hpp"

namespace memfit {
namespace {

uint64_t max_rss_of(const std::string& report) {
  std::ifstream f(report);
  const auto j = nlohmann::json::parse(f);
  return j["memory"]["max_rss_bytes"].get<uint64_t>();
}

TEST(LoadRss, LoadingWeightsAddsNoMoreThanAChunkToRss) {
  const std::string dir = test::temp_dir();
  // 2 layers, 512 channels, a 32768-token vocabulary: 23.1M parameters, a 92 MB fp32 file.
  const std::string config = dir + "/config.json";
  std::ofstream(config) << R"({"model_type":"gpt2","n_layer":2,"n_head":8,"n_embd":512,"n_positions":64,)"
                           R"("vocab_size":32768})";
  const std::string common = " --model " + config + " --steps 1 --batch 1 --seq 16 --val-fraction 0 --threads 2";
  auto r = test::run_memfit("train" + common + " --save " + dir + "/weights");
  ASSERT_EQ(r.status, 0) << r.err;
  r = test::run_memfit("train" + common + " --report-json " + dir + "/fresh.json");  // saving copies: not here
  ASSERT_EQ(r.status, 0) << r.err;
  r = test::run_memfit("train" + common + " --load " + dir + "/weights --report-json " + dir + "/loaded.json");
  ASSERT_EQ(r.status, 0) << r.err;
  const uint64_t fresh = max_rss_of(dir + "/fresh.json"), loaded = max_rss_of(dir + "/loaded.json");
  // The file is 92 MB; one 4 MiB chunk and the header pages may stay, plus allocator noise.
  constexpr uint64_t kConstant = uint64_t(24) << 20;
  EXPECT_LT(loaded, fresh + kConstant) << "max RSS " << loaded << " with --load, " << fresh << " without";
}

}  // namespace
}  // namespace memfit
