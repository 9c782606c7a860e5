// `train --data text --tokenizer`: the text is tokenised once into a cache next to it (the ids
// the tokenizer gives the whole text, which tests/text checks against the tokenizers library),
// reused while the tokenizer and the text stay the same; a text file given to a model whose
// vocabulary exceeds bytes, without a tokenizer, is refused in one line naming the fix.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "io/token_file.hpp"
#include "support/paths.hpp"
#include "support/run_cli.hpp"
#include "text/tokenizer.hpp"

namespace memfit {
namespace {

namespace fs = std::filesystem;

struct TextRun {
  std::string dir = test::temp_dir();
  std::string text = dir + "/corpus.txt", model = dir + "/gpt2_1k.json";
  std::string tokenizer = test::fixture_path("tokenizer/bytelevel.json");
  TextRun() {
    std::ifstream in(test::fixture_path("tokenizer/corpus.txt"));
    std::stringstream corpus;
    corpus << in.rdbuf();
    std::string repeated;
    for (int i = 0; i < 8; ++i) repeated += corpus.str();
    test::write_file(text, repeated);
    test::write_file(model, R"({"model_type": "gpt2", "n_layer": 1, "n_head": 2, "n_embd": 32, "n_positions": 64,
                                "vocab_size": 1024})");
  }
  std::vector<std::string> caches() const {
    std::vector<std::string> found;
    for (const auto& e : fs::directory_iterator(dir))
      if (e.path().string().ends_with(".tokens.bin")) found.push_back(e.path().string());
    return found;
  }
};

TEST(TokenCache, TextIsTokenisedOnceWithTheTokenizersIds) {
  const TextRun s;
  const std::string run = "train --model " + s.model + " --data " + s.text + " --tokenizer " + s.tokenizer +
                          " --steps 2 --batch 2 --seq 16 --val-fraction 0.1";
  const auto first = test::run_memfit(run);
  ASSERT_EQ(first.status, 0) << first.err;
  EXPECT_NE(first.out.find("tokenised"), std::string::npos) << first.out;
  const auto caches = s.caches();
  ASSERT_EQ(caches.size(), 1u);
  // The cache holds exactly the ids of the whole text.
  std::ifstream in(s.text);
  std::stringstream text;
  text << in.rdbuf();
  const std::vector<uint32_t> ids = text::Tokenizer::load(s.tokenizer).encode(text.str());
  const TokenData cached = TokenData::open(caches[0]);
  ASSERT_EQ(cached.size(), int64_t(ids.size()));
  for (size_t i = 0; i < ids.size(); ++i) ASSERT_EQ(cached.at(int64_t(i)), int32_t(ids[i])) << i;
  // Reused the second time.
  const auto second = test::run_memfit(run);
  ASSERT_EQ(second.status, 0) << second.err;
  EXPECT_NE(second.out.find("tokenised before"), std::string::npos) << second.out;
  EXPECT_EQ(s.caches().size(), 1u);
  // A changed text gets a cache of its own.
  test::write_file(s.text, text.str() + "one more line\n");
  ASSERT_EQ(test::run_memfit(run).status, 0);
  EXPECT_EQ(s.caches().size(), 2u);
}

TEST(TokenCache, TextForALargeVocabularyWithoutATokenizerIsRefused) {
  const TextRun s;
  const auto r = test::run_memfit("train --model " + s.model + " --data " + s.text + " --steps 1 --batch 2 --seq 16");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("vocabulary of 1024"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("--tokenizer"), std::string::npos) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
}

}  // namespace
}  // namespace memfit
