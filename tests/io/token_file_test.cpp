// Token files: llm.c files built header by header here, nanoGPT and text files built byte by
// byte, format detection, and every malformed case the loader must refuse.
#include "io/token_file.hpp"

#include <gtest/gtest.h>

#include <filesystem>
#include <numeric>

#include "io/io_test_util.hpp"

namespace memfit {
namespace {

using test::bytes_of;
using test::expect_error;
using test::ScratchDir;

std::string llmc_header(int32_t magic, int32_t version, int32_t count) {
  std::vector<int32_t> header(256, 0);
  header[0] = magic;
  header[1] = version;
  header[2] = count;
  return std::string(reinterpret_cast<const char*>(header.data()), 1024);
}

std::vector<int32_t> all_tokens(const TokenData& data) {
  std::vector<int32_t> out(size_t(data.size()));
  data.copy(0, data.size(), out.data());
  return out;
}

TEST(TokenFormat, ParsesItsNames) {
  EXPECT_EQ(parse_token_format("auto"), TokenFormat::automatic);
  EXPECT_EQ(parse_token_format("llmc"), TokenFormat::llmc);
  EXPECT_EQ(parse_token_format("nanogpt"), TokenFormat::nanogpt);
  EXPECT_EQ(parse_token_format("text"), TokenFormat::text);
  expect_error([] { (void)parse_token_format("parquet"); }, "data", {"'parquet'", "auto, llmc, nanogpt or text"});
}

TEST(TokenFile, WritesTheLlmcLayoutAndReadsItBack) {
  ScratchDir dir;
  const std::string path = dir.file("train.bin");
  const std::vector<uint16_t> tokens = {50256, 0, 1, 65535, 464, 3290};
  write_llmc_tokens(path, tokens);

  // The bytes, independently of the reader: 256 int32 then the uint16 tokens.
  const std::string bytes = test::read_bytes(path);
  ASSERT_EQ(bytes.size(), 1024u + 2 * tokens.size());
  EXPECT_EQ(bytes.substr(0, 1024), llmc_header(20240520, 1, 6));
  EXPECT_EQ(bytes.substr(1024), std::string(reinterpret_cast<const char*>(tokens.data()), 12));
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));

  for (TokenFormat format : {TokenFormat::automatic, TokenFormat::llmc}) {
    const TokenData data = TokenData::open(path, format);
    EXPECT_EQ(data.format(), TokenFormat::llmc);
    EXPECT_EQ(data.size(), 6);
    EXPECT_EQ(data.vocab_hint(), 65536);
    EXPECT_EQ(all_tokens(data), (std::vector<int32_t>{50256, 0, 1, 65535, 464, 3290}));
    EXPECT_EQ(data.at(3), 65535);  // unsigned: not -1
    EXPECT_NE(data.description().find(path), std::string::npos);
    int32_t window[2];
    data.copy(4, 2, window);
    EXPECT_EQ(window[0], 464);
    EXPECT_EQ(window[1], 3290);
  }
}

TEST(TokenFile, RefusesMalformedLlmcFiles) {
  ScratchDir dir;
  const std::string path = dir.file("bad.bin");
  const std::string four_tokens = bytes_of<uint16_t>({1, 2, 3, 4});
  const struct {
    const char* what;
    std::string bytes;
    std::vector<std::string_view> expected;
  } cases[] = {
      {"bad magic", llmc_header(20240521, 1, 4) + four_tokens, {"magic 20240521", "20240520", "20240801"}},
      {"gpt-2 magic, version 2", llmc_header(20240520, 2, 4) + four_tokens, {"version 2", "expected 1"}},
      {"unknown version", llmc_header(20240520, 7, 4) + four_tokens, {"version 7"}},
      {"llama 3 magic, gpt-2 version", llmc_header(20240801, 1, 2) + four_tokens, {"version 1", "expected 7"}},
      {"llama 3 tokens cut short", llmc_header(20240801, 7, 4) + four_tokens,
       {"1040 bytes", "1032 bytes", "truncated"}},
      {"negative count", llmc_header(20240520, 1, -4) + four_tokens, {"negative token count -4"}},
      {"truncated", llmc_header(20240520, 1, 4) + four_tokens.substr(0, 6), {"1032 bytes", "1030 bytes", "truncated"}},
      {"padded", llmc_header(20240520, 1, 4) + four_tokens + "xy", {"1032 bytes", "1034 bytes", "trailing"}},
      {"header cut short", llmc_header(20240520, 1, 4).substr(0, 100), {"100 bytes", "1024-byte llm.c header"}},
      {"one token", llmc_header(20240520, 1, 1) + bytes_of<uint16_t>({7}), {"1 token(s) is too few"}},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.what);
    test::write_bytes(path, c.bytes);
    // The magic test names the format explicitly: detection would (rightly) take it for nanoGPT.
    const std::string message = expect_error([&] { (void)TokenData::open(path, TokenFormat::llmc); }, "data", {path});
    for (std::string_view part : c.expected) EXPECT_NE(message.find(part), std::string::npos) << part << " / " << message;
  }
}

// An llm.c file whose magic is damaged is refused in automatic mode, naming the magic, not read
// (header and all) as nanoGPT tokens; naming the format explicitly still reads raw tokens.
TEST(TokenFile, RefusesAnLlmcHeaderWithADamagedMagic) {
  ScratchDir dir;
  const std::string path = dir.file("train.bin");
  const std::string four_tokens = bytes_of<uint16_t>({1, 2, 3, 4});
  const struct {
    const char* what;
    std::string bytes;
    std::string expected;
  } cases[] = {
      {"zeroed magic", llmc_header(0, 1, 4) + four_tokens, "bad magic 0"},
      {"one bit off", llmc_header(20240521, 1, 4) + four_tokens, "bad magic 20240521"},
      {"zeroed magic, llama 3", llmc_header(0, 7, 4) + four_tokens + four_tokens, "bad magic 0"},
      {"zeroed magic, truncated", llmc_header(0, 1, 400) + four_tokens, "bad magic 0"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.what);
    test::write_bytes(path, c.bytes);
    expect_error([&] { (void)TokenData::open(path); }, "data", {path, c.expected, "llm.c header"});
  }
  EXPECT_EQ(TokenData::open(path, TokenFormat::nanogpt).size(), 516);
}

TEST(TokenFile, RefusesNonZeroReservedLlmcHeaderFields) {
  ScratchDir dir;
  const std::string path = dir.file("train.bin");
  std::string bytes = llmc_header(20240520, 1, 4) + bytes_of<uint16_t>({1, 2, 3, 4});
  bytes[4 * 200] = 9;
  test::write_bytes(path, bytes);
  expect_error([&] { (void)TokenData::open(path); }, "data", {path, "header field 200 is 9"});
}

// The range check finds the first token at or above the vocabulary, in any block, for each width.
TEST(TokenFile, ChecksEveryTokenOfASplitAgainstTheVocabulary) {
  ScratchDir dir;
  std::vector<uint16_t> tokens(10000, 7);
  tokens[9001] = 300;
  tokens[9500] = 400;
  const TokenData data = TokenData::from_tokens(tokens, "split.bin");
  data.check_tokens_below(0, 9001, 8);
  data.check_tokens_below(0, 10000, 401);
  expect_error([&] { data.check_tokens_below(0, 10000, 300); }, "data", {"token 300 at position 9001", "split.bin", "300"});
  expect_error([&] { data.check_tokens_below(9002, 10000, 300); }, "data", {"token 400 at position 9500"});
  const std::string wide = dir.file("wide.bin");
  std::vector<uint32_t> llama3(5000, 3);
  llama3[4999] = 128000;
  test::write_bytes(wide, llmc_header(20240801, 7, 5000) +
                              std::string(reinterpret_cast<const char*>(llama3.data()), llama3.size() * 4));
  const TokenData wide_data = TokenData::open(wide);
  wide_data.check_tokens_below(0, 4999, 4);
  expect_error([&] { wide_data.check_tokens_below(0, 5000, 128000); }, "data", {"token 128000 at position 4999"});
  const std::string text = dir.file("t.txt");
  test::write_bytes(text, "abcz");
  expect_error([&] { TokenData::open(text).check_tokens_below(0, 4, 'z'); }, "data", {"token 122 at position 3"});
}

// llm.c's Llama 3 files (magic 20240801, version 7): uint32 tokens past 65535, detected by
// their magic (not taken for a nanoGPT file because of the .bin name).
TEST(TokenFile, ReadsLlama3LlmcFilesWithUint32Tokens) {
  ScratchDir dir;
  const std::string path = dir.file("llama3.bin");
  const std::vector<uint32_t> tokens = {128000, 9906, 11, 65536, 128255, 0};
  test::write_bytes(path, llmc_header(20240801, 7, 6) + bytes_of<uint32_t>({128000, 9906, 11, 65536, 128255, 0}));
  const TokenData data = TokenData::open(path);
  EXPECT_EQ(data.format(), TokenFormat::llmc);
  ASSERT_EQ(data.size(), 6);
  EXPECT_EQ(all_tokens(data), std::vector<int32_t>(tokens.begin(), tokens.end()));
  EXPECT_EQ(data.at(4), 128255);
  EXPECT_GT(data.vocab_hint(), 128255);
}

TEST(TokenFile, ReadsNanogptRawTokens) {
  ScratchDir dir;
  const std::string path = dir.file("val.bin");
  test::write_bytes(path, bytes_of<uint16_t>({10, 20, 40000, 30}));
  for (TokenFormat format : {TokenFormat::automatic, TokenFormat::nanogpt}) {
    const TokenData data = TokenData::open(path, format);
    EXPECT_EQ(data.format(), TokenFormat::nanogpt);
    EXPECT_EQ(all_tokens(data), (std::vector<int32_t>{10, 20, 40000, 30}));
    EXPECT_EQ(data.vocab_hint(), 65536);
  }
  test::write_bytes(path, "abc");
  expect_error([&] { (void)TokenData::open(path); }, "data", {path, "3 bytes", "odd"});
  test::write_bytes(path, "ab");
  expect_error([&] { (void)TokenData::open(path); }, "data", {path, "1 token(s) is too few"});
}

TEST(TokenFile, ReadsTextAsOneTokenPerByte) {
  ScratchDir dir;
  const std::string path = dir.file("input.txt");
  test::write_bytes(path, "Hi\n\xC3\xA9\xFF");
  const TokenData data = TokenData::open(path);
  EXPECT_EQ(data.format(), TokenFormat::text);
  EXPECT_EQ(data.vocab_hint(), 256);
  EXPECT_EQ(all_tokens(data), (std::vector<int32_t>{'H', 'i', '\n', 0xC3, 0xA9, 0xFF}));  // bytes, unsigned
  EXPECT_EQ(data.at(5), 255);
}

TEST(TokenFile, DetectsTheFormat) {
  ScratchDir dir;
  // The magic decides, whatever the extension.
  const std::string llmc = dir.file("tokens.dat");
  test::write_bytes(llmc, llmc_header(20240520, 1, 2) + bytes_of<uint16_t>({5, 6}));
  EXPECT_EQ(TokenData::open(llmc).format(), TokenFormat::llmc);
  // .bin without the magic and without an llm.c header is nanoGPT.
  const std::string raw = dir.file("tokens.bin");
  test::write_bytes(raw, bytes_of<uint16_t>({0x9A58, 0x0134, 1, 0, 2, 0, 5, 6}));
  EXPECT_EQ(TokenData::open(raw).format(), TokenFormat::nanogpt);
  EXPECT_EQ(TokenData::open(raw).size(), 8);
  // Anything else is text, including files with no extension and files shorter than 4 bytes.
  for (const char* name : {"notes.txt", "README", "x.binary"}) {
    const std::string text = dir.file(name);
    test::write_bytes(text, "abcd");
    EXPECT_EQ(TokenData::open(text).format(), TokenFormat::text) << name;
  }
  const std::string tiny = dir.file("tiny.bin");
  test::write_bytes(tiny, "ab");
  EXPECT_EQ(TokenData::open(tiny, TokenFormat::text).size(), 2);
  // A text file read as llm.c is refused, not misread.
  const std::string text = dir.file("story.txt");
  test::write_bytes(text, std::string(2000, 'a'));
  expect_error([&] { (void)TokenData::open(text, TokenFormat::llmc); }, "data", {text, "magic"});
}

TEST(TokenFile, RefusesMissingEmptyAndDirectoryPaths) {
  ScratchDir dir;
  expect_error([&] { (void)TokenData::open(dir.file("absent.bin")); }, "data", {"absent.bin", "no such file"});
  expect_error([&] { (void)TokenData::open(dir.path().string()); }, "data", {"is a directory"});
  const std::string empty = dir.file("empty.txt");
  test::write_bytes(empty, "");
  expect_error([&] { (void)TokenData::open(empty); }, "data", {empty, "empty"});
  const std::string one = dir.file("one.txt");
  test::write_bytes(one, "x");
  expect_error([&] { (void)TokenData::open(one); }, "data", {one, "too few"});
}

TEST(TokenFile, MovesWithoutLosingTheMapping) {
  ScratchDir dir;
  const std::string path = dir.file("m.bin");
  write_llmc_tokens(path, std::vector<uint16_t>{1, 2, 3});
  TokenData a = TokenData::open(path);
  TokenData b = std::move(a);
  EXPECT_EQ(b.size(), 3);
  EXPECT_EQ(a.size(), 0);  // moved-from is empty, not dangling
  EXPECT_EQ(all_tokens(b), (std::vector<int32_t>{1, 2, 3}));

  TokenData owned = TokenData::from_tokens({7, 8, 9, 10}, "in memory");
  owned = std::move(b);  // releases nothing b still needs; owned's vector is freed
  EXPECT_EQ(all_tokens(owned), (std::vector<int32_t>{1, 2, 3}));

  std::vector<TokenData> many;
  for (int i = 0; i < 20; ++i) many.push_back(TokenData::from_tokens({uint16_t(i), uint16_t(i + 1)}, "t"));
  for (int i = 0; i < 20; ++i) EXPECT_EQ(many[size_t(i)].at(1), i + 1);  // survived reallocation
}

TEST(TokenFile, OwnsTokensFromMemory) {
  const TokenData data = TokenData::from_tokens({3, 1, 4, 1, 5}, "digits of pi");
  EXPECT_EQ(data.size(), 5);
  EXPECT_EQ(data.description(), "digits of pi");
  EXPECT_EQ(data.vocab_hint(), 65536);
  EXPECT_EQ(all_tokens(data), (std::vector<int32_t>{3, 1, 4, 1, 5}));
  expect_error([] { (void)TokenData::from_tokens({1}, "single"); }, "data", {"single", "too few"});
}

TEST(TokenFile, WriterKeepsTheExistingFileWhenItCannotWrite) {
  ScratchDir dir;
  const std::string missing = dir.file("no-dir/t.bin");
  expect_error([&] { write_llmc_tokens(missing, std::vector<uint16_t>{1, 2}); }, "data", {missing, "cannot create"});
  const std::string path = dir.file("t.bin");
  write_llmc_tokens(path, std::vector<uint16_t>{1, 2});
  write_llmc_tokens(path, std::vector<uint16_t>{3, 4, 5});
  EXPECT_EQ(all_tokens(TokenData::open(path)), (std::vector<int32_t>{3, 4, 5}));
}

TEST(TokenFile, OpensTinyShakespeareAsText) {
  const std::string path = "/work/shared/data/tinyshakespeare.txt";
  if (!std::filesystem::exists(path)) GTEST_SKIP() << path << " not present";
  const TokenData data = TokenData::open(path);
  EXPECT_EQ(data.format(), TokenFormat::text);
  EXPECT_EQ(data.size(), int64_t(std::filesystem::file_size(path)));
  EXPECT_EQ(data.at(0), 'F');  // "First Citizen:"
  int32_t first[5];
  data.copy(0, 5, first);
  EXPECT_EQ(std::string(first, first + 5), "First");
}

}  // namespace
}  // namespace memfit
