// `memfit tokenize` writes llm.c token files that the token loader (io/token_file) reads back
// with the ids the HF `tokenizers` library gives (tests/fixtures/tokenizer/expected_*.json),
// whatever the chunk size the text is streamed in, and splits off the validation file.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

#include <nlohmann/json.hpp>

#include "io/token_file.hpp"
#include "support/paths.hpp"
#include "support/run_cli.hpp"

namespace memfit {
namespace {

using test::fixture_path;
using test::run_memfit;

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

std::vector<uint32_t> expected_ids(const std::string& name, const std::string& which) {
  const auto want = nlohmann::json::parse(read_file(fixture_path("tokenizer/expected_" + name + ".json")));
  return want.at(which).at("ids").get<std::vector<uint32_t>>();
}

std::vector<uint32_t> tokens_of(const std::string& path) {
  const TokenData data = TokenData::open(path);
  EXPECT_EQ(data.format(), TokenFormat::llmc) << path;
  std::vector<uint32_t> ids;
  for (int64_t i = 0; i < data.size(); ++i) ids.push_back(uint32_t(data.at(i)));
  return ids;
}

std::string inputs() {
  return fixture_path("tokenizer/corpus.txt") + " " + fixture_path("tokenizer/edge_cases.txt");
}

TEST(TokenizeCli, WritesTheIdsOfTokenizersForEveryChunkSize) {
  for (const std::string name : {"bytelevel", "sentencepiece"}) {
    std::vector<uint32_t> want = expected_ids(name, "corpus");
    const auto edge = expected_ids(name, "edge_cases");
    want.insert(want.end(), edge.begin(), edge.end());
    for (const std::string chunk : {"1048576", "64", "1"}) {
      const std::string out = test::temp_dir() + "/tokens.bin";
      const auto r = run_memfit("tokenize --tokenizer " + fixture_path("tokenizer/" + name + ".json") + " --input " +
                                inputs() + " --out " + out + " --val-fraction 0 --chunk-bytes " + chunk);
      ASSERT_EQ(r.status, 0) << r.err;
      EXPECT_EQ(tokens_of(out), want) << name << ", chunks of " << chunk << " bytes";
      EXPECT_FALSE(std::filesystem::exists(test::temp_dir() + "/tokens_val.bin"));
      EXPECT_NE(r.err.find("[text] tokenize: "), std::string::npos) << "a progress line on stderr";
    }
  }
}

TEST(TokenizeCli, SplitsTheLastFractionIntoTheValidationFileAtALineStart) {
  const std::string dir = test::temp_dir();
  const auto r = run_memfit("tokenize --tokenizer " + fixture_path("tokenizer/bytelevel.json") + " --input " +
                            fixture_path("tokenizer/corpus.txt") + " --out " + dir + "/corpus_train.bin" +
                            " --val-fraction 0.25 --chunk-bytes 100 --quiet");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.err, "");
  const auto train = tokens_of(dir + "/corpus_train.bin");
  const auto val = tokens_of(dir + "/corpus_val.bin");
  std::vector<uint32_t> both = train;
  both.insert(both.end(), val.begin(), val.end());
  EXPECT_EQ(both, expected_ids("bytelevel", "corpus"));
  const double share = double(val.size()) / double(both.size());
  EXPECT_GT(share, 0.15);
  EXPECT_LT(share, 0.35);
}

// A vocabulary over 65536 ids gives a uint32 (llm.c Llama 3) file, which the loader reads.
TEST(TokenizeCli, WritesUint32TokensForALargeVocabulary) {
  auto spec = nlohmann::json::parse(read_file(fixture_path("tokenizer/bytelevel.json")));
  spec["added_tokens"].push_back({{"id", 70000}, {"content", "<|big|>"}, {"single_word", false}, {"lstrip", false},
                                  {"rstrip", false}, {"normalized", false}, {"special", true}});
  const std::string dir = test::temp_dir();
  test::write_file(dir + "/tokenizer.json", spec.dump());
  test::write_file(dir + "/in.txt", "hello<|big|>world\n");
  const auto r = run_memfit("tokenize --tokenizer " + dir + " --input " + dir + "/in.txt --out " + dir +
                            "/t.bin --val-fraction 0 --quiet");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(read_file(dir + "/t.bin").size() % 4, 0u);
  const auto ids = tokens_of(dir + "/t.bin");
  ASSERT_GE(ids.size(), 3u);
  EXPECT_NE(std::find(ids.begin(), ids.end(), 70000u), ids.end());
  EXPECT_NE(r.out.find("32-bit"), std::string::npos) << r.out;
}

TEST(TokenizeCli, ErrorsAreOneLine) {
  const std::string dir = test::temp_dir();
  test::write_file(dir + "/tokenizer.json", "{\"model\": {\"type\": \"Unigram\", \"vocab\": []}}");
  auto r = run_memfit("tokenize --tokenizer " + dir + " --input " + inputs() + " --out " + dir + "/refused.bin");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("[text] " + dir + "/tokenizer.json: model type 'Unigram' is not supported"), std::string::npos)
      << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  EXPECT_FALSE(std::filesystem::exists(dir + "/refused.bin"));
  r = run_memfit("tokenize --tokenizer " + fixture_path("tokenizer/bytelevel.json") + " --input " + dir +
                 "/missing.txt --out " + dir + "/t.bin");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("missing.txt"), std::string::npos) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
}

}  // namespace
}  // namespace memfit
