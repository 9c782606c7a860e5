// safetensors reader and writer against files built byte by byte here: the reader on
// hand-written headers (valid and malformed), the writer by parsing its bytes by hand.
#include "io/safetensors.hpp"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>
#include <vector>

#include "io/io_test_util.hpp"
#include "runtime/rss.hpp"

namespace memfit {
namespace {

using test::bytes_of;
using test::expect_error;
using test::le_u64;
using test::ScratchDir;

std::string safetensors_bytes(const std::string& header, const std::string& data) {
  return le_u64(header.size()) + header + data;
}

// A file as a PyTorch user would write it: tensors of several dtypes, listed in the header in
// an order (alphabetical, as JSON objects come back) different from their order in the data.
struct HandBuiltFile {
  ScratchDir dir;
  std::string path = dir.file("model.safetensors");
  HandBuiltFile() {
    const std::string header =
        R"({"__metadata__":{"format":"pt"},)"
        R"("w":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]},)"
        R"("b":{"dtype":"BF16","shape":[2],"data_offsets":[24,28]},)"
        R"("h":{"dtype":"F16","shape":[3],"data_offsets":[28,34]},)"
        R"("s":{"dtype":"I32","shape":[],"data_offsets":[34,38]},)"
        R"("e":{"dtype":"U8","shape":[0,4],"data_offsets":[38,38]},)"
        R"("pos":{"dtype":"I64","shape":[2],"data_offsets":[38,54]}})";
    const std::string data = bytes_of<float>({1, 2, 3, 4, 5, 6}) + bytes_of<uint16_t>({0x3F80, 0xC2F7}) +
                             bytes_of<uint16_t>({0x3C00, 0x0001, 0xFC00}) + bytes_of<int32_t>({-7}) +
                             bytes_of<int64_t>({0, 1});
    test::write_bytes(path, safetensors_bytes(header, data));
  }
};

TEST(SafetensorsReader, ListsHandBuiltTensorsInFileOrder) {
  HandBuiltFile f;
  SafetensorsReader r(f.path);
  EXPECT_EQ(r.path(), f.path);
  std::vector<std::string> names;
  for (const SafetensorsEntry& e : r.entries()) names.push_back(e.name);
  EXPECT_EQ(names, (std::vector<std::string>{"w", "b", "h", "s", "e", "pos"}));

  const SafetensorsEntry* w = r.find("w");
  ASSERT_NE(w, nullptr);
  EXPECT_EQ(w->dtype, DType::f32);
  EXPECT_EQ(w->shape, Shape({2, 3}));
  EXPECT_EQ(w->begin, 0u);
  EXPECT_EQ(w->end, 24u);
  EXPECT_EQ(r.find("b")->dtype, DType::bf16);
  EXPECT_EQ(r.find("h")->dtype, DType::f16);
  EXPECT_EQ(r.find("s")->shape, Shape());  // scalar
  EXPECT_EQ(r.find("s")->shape.numel(), 1);
  EXPECT_EQ(r.find("e")->shape, Shape({0, 4}));
  EXPECT_EQ(r.find("nope"), nullptr);
  EXPECT_EQ(r.metadata(), (std::map<std::string, std::string>{{"format", "pt"}}));

  int32_t s = 0;
  std::memcpy(&s, r.data(*r.find("s")), 4);  // at offset 34: unaligned, as the file put it
  EXPECT_EQ(s, -7);
}

TEST(SafetensorsReader, ReadsFloatTensorsAsF32) {
  HandBuiltFile f;
  SafetensorsReader r(f.path);
  std::vector<float> w(6);
  r.read_f32("w", Shape{2, 3}, w.data());
  EXPECT_EQ(w, (std::vector<float>{1, 2, 3, 4, 5, 6}));
  r.read_f32("w", Shape{2, 3}, w.data(), /*transpose2d=*/true);
  EXPECT_EQ(w, (std::vector<float>{1, 4, 2, 5, 3, 6}));  // [3, 2]

  std::vector<float> b(2);
  r.read_f32("b", Shape{2}, b.data());
  EXPECT_EQ(b, (std::vector<float>{1.0f, -123.5f}));
  std::vector<float> h(3);
  r.read_f32("h", Shape{3}, h.data());
  EXPECT_EQ(h[0], 1.0f);
  EXPECT_EQ(h[1], 5.960464477539063e-08f);
  EXPECT_EQ(h[2], -std::numeric_limits<float>::infinity());
}

TEST(SafetensorsReader, TransposesLargeTensorsAcrossTiles) {
  // 70 x 130 crosses the 64-element tiles in both directions, with ragged edges.
  const int64_t rows = 70, cols = 130;
  std::vector<uint16_t> src(size_t(rows * cols));
  for (int64_t i = 0; i < rows * cols; ++i) src[size_t(i)] = uint16_t(0x3C00 + (i % 1024));  // 1 + k/1024 in fp16
  ScratchDir dir;
  const std::string path = dir.file("t.safetensors");
  const SafetensorsTensor t{"t", DType::f16, Shape{rows, cols}, src.data()};
  write_safetensors(path, std::span(&t, 1));
  std::vector<float> out(size_t(rows * cols));
  SafetensorsReader(path).read_f32("t", Shape{rows, cols}, out.data(), true);
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j)
      ASSERT_EQ(out[size_t(j * rows + i)], 1.0f + float((i * cols + j) % 1024) / 1024.0f) << i << "," << j;
}

TEST(SafetensorsReader, RefusesWrongReads) {
  HandBuiltFile f;
  SafetensorsReader r(f.path);
  std::vector<float> buf(16);
  expect_error([&] { r.read_f32("w", Shape{3, 2}, buf.data()); }, "safetensors",
               {f.path, "'w'", "(2, 3)", "expected (3, 2)"});
  expect_error([&] { r.read_f32("nope", Shape{1}, buf.data()); }, "safetensors", {f.path, "no tensor named 'nope'"});
  expect_error([&] { r.read_f32("s", Shape{}, buf.data()); }, "safetensors", {"'s'", "I32"});
  expect_error([&] { r.read_f32("b", Shape{2}, buf.data(), true); }, "safetensors", {"'b'", "2-d"});
  // I64 is a valid safetensors dtype memfit has no type for: listed, but not readable.
  const SafetensorsEntry* pos = r.find("pos");
  ASSERT_NE(pos, nullptr);
  EXPECT_FALSE(pos->supported);
  EXPECT_EQ(pos->file_dtype, "I64");
  EXPECT_EQ(pos->bytes(), 16u);
  expect_error([&] { r.read_f32("pos", Shape{2}, buf.data()); }, "safetensors", {"'pos'", "I64"});
  expect_error([&] { (void)r.data(*pos); }, "safetensors", {"'pos'", "I64", "not support"});
}

TEST(SafetensorsReader, AcceptsHeaderPaddedWithSpaces) {
  // HF pads the header with spaces so that the data section starts 8-byte aligned.
  ScratchDir dir;
  const std::string path = dir.file("padded.safetensors");
  std::string header = R"({"x":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})";
  header.append((8 - header.size() % 8) % 8 + 8, ' ');
  test::write_bytes(path, safetensors_bytes(header, bytes_of<float>({2.5f})));
  float x = 0;
  SafetensorsReader(path).read_f32("x", Shape{1}, &x);
  EXPECT_EQ(x, 2.5f);
}

struct MalformedCase {
  std::string what;
  std::string bytes;
  std::string expected;  // a part of the error message
};

std::string with_header(const std::string& header, size_t data_bytes = 16) {
  return safetensors_bytes(header, std::string(data_bytes, '\0'));
}

std::vector<MalformedCase> malformed_cases() {
  const std::string ok_a = R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})";
  return {
      {"shorter than the length field", std::string("\x05\0\0\0\0", 5), "5 bytes is too short"},
      {"header length beyond the file", le_u64(1000) + "{}", "runs past the end of the file"},
      {"header length near 2^64", le_u64(~uint64_t(0)) + "{}", "runs past the end of the file"},
      {"empty header", with_header(""), "does not start with '{'"},
      {"invalid JSON", with_header(R"({"a":)"), "not valid JSON"},
      {"invalid UTF-8", with_header("{\"a\xff\":1}"), "not valid JSON"},
      {"header is an array", with_header("[1,2]"), "does not start with '{'"},
      {"entry not an object", with_header(R"({"a":3})"), "must be an object"},
      {"missing dtype", with_header(R"({"a":{"shape":[2],"data_offsets":[0,8]}})"), "missing 'dtype'"},
      {"missing offsets", with_header(R"({"a":{"dtype":"F32","shape":[2]}})"), "missing 'data_offsets'"},
      {"dtype not a string", with_header(R"({"a":{"dtype":5,"shape":[2],"data_offsets":[0,8]}})"), "'dtype' must be a string"},
      {"unknown dtype", with_header(R"({"a":{"dtype":"Q7","shape":[2],"data_offsets":[0,8]}})"), "unknown dtype 'Q7'"},
      {"negative extent", with_header(R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})"), "not a non-negative integer"},
      {"fractional extent", with_header(R"({"a":{"dtype":"F32","shape":[2.0],"data_offsets":[0,8]}})"), "not a non-negative integer"},
      {"shape not an array", with_header(R"({"a":{"dtype":"F32","shape":2,"data_offsets":[0,8]}})"), "'shape' must be an array"},
      {"shape overflowing 64 bits", with_header(R"({"a":{"dtype":"U8","shape":[4294967296,4294967296,4],"data_offsets":[0,8]}})"), "more elements than fit"},
      {"shape larger than the data", with_header(R"({"a":{"dtype":"F64","shape":[4611686018427387904],"data_offsets":[0,8]}})"), "more bytes than the data section"},
      {"three offsets", with_header(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,4,8]}})"), "'data_offsets' must be [begin, end]"},
      {"negative offset", with_header(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[-8,0]}})"), "'data_offsets' must be [begin, end]"},
      {"offsets reversed", with_header(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[8,4]}})"), "end before they begin"},
      {"offsets beyond the data", with_header(R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[8,24]}})"), "run past the end of the data section"},
      {"byte count not matching shape", with_header(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})"), "needs 12 bytes"},
      {"sub-byte count", with_header(R"({"a":{"dtype":"F4","shape":[3],"data_offsets":[0,2]}})"), "do not fill whole bytes"},
      {"overlapping tensors", with_header("{" + ok_a + R"(,"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})"), "overlap"},
      {"tensor inside another", with_header(R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},"b":{"dtype":"U8","shape":[2],"data_offsets":[4,6]}})"), "overlap"},
      {"duplicate name", with_header("{" + ok_a + "," + ok_a + "}"), "names tensor 'a' twice"},
      {"metadata not an object", with_header(R"({"__metadata__":[1]})"), "'__metadata__' must be an object"},
      {"metadata value not a string", with_header(R"({"__metadata__":{"k":1}})"), "'__metadata__' value of 'k'"},
      {"deep nesting", with_header(R"({"a":{"dtype":"F32","shape":[[[[2]]]],"data_offsets":[0,8]}})"), "nests deeper"},
  };
}

TEST(SafetensorsReader, EachMalformedFileGivesOneClearError) {
  ScratchDir dir;
  for (const MalformedCase& c : malformed_cases()) {
    SCOPED_TRACE(c.what);
    const std::string path = dir.file("bad.safetensors");
    test::write_bytes(path, c.bytes);
    expect_error([&] { SafetensorsReader r(path); }, "safetensors", {path, c.expected});
  }
}

TEST(SafetensorsReader, RefusesHeaderOverTheSizeLimit) {
  // A sparse file, so that the header length is inside the file but above 100 MB.
  ScratchDir dir;
  const std::string path = dir.file("huge.safetensors");
  test::write_bytes(path, le_u64(100'000'001) + "{");
  std::filesystem::resize_file(path, 8 + 100'000'001);
  expect_error([&] { SafetensorsReader r(path); }, "safetensors", {path, "100000001", "exceeds the limit"});
}

TEST(SafetensorsReader, RefusesMissingFilesAndDirectories) {
  ScratchDir dir;
  expect_error([&] { SafetensorsReader r(dir.file("absent.safetensors")); }, "safetensors", {"absent.safetensors", "no such file"});
  expect_error([&] { SafetensorsReader r(dir.path().string()); }, "safetensors", {"is a directory"});
}

TEST(SafetensorsReader, AllowsZeroSizedTensorsBetweenOthers) {
  ScratchDir dir;
  const std::string path = dir.file("empty.safetensors");
  test::write_bytes(path, with_header(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                                      R"("z":{"dtype":"F32","shape":[0],"data_offsets":[8,8]},)"
                                      R"("b":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})"));
  SafetensorsReader r(path);
  EXPECT_EQ(r.entries().size(), 3u);
  EXPECT_EQ(r.find("z")->bytes(), 0u);
}

// The format requires the tensors to tile the data section exactly (HF's reader refuses
// anything else); each departure is refused naming the file and the tensor or field.
TEST(SafetensorsReader, RefusesDataNotTiledExactlyByTheTensors) {
  ScratchDir dir;
  const std::string a = R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})";
  const std::vector<MalformedCase> cases = {
      {"hole between tensors", with_header("{" + a + R"(,"b":{"dtype":"F32","shape":[1],"data_offsets":[12,16]}})"),
       "tensor 'b': data_offsets [12, 16] leave bytes [8, 12)"},
      {"hole at the start", with_header(R"({"b":{"dtype":"F32","shape":[3],"data_offsets":[4,16]}})"),
       "tensor 'b': data_offsets [4, 16] leave bytes [0, 4)"},
      {"trailing bytes", with_header("{" + a + "}", 12), "4 bytes belong to no tensor"},
      {"empty tensor inside another", with_header(R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},)"
                                                  R"("z":{"dtype":"F32","shape":[0],"data_offsets":[8,8]}})"),
       "overlap"},
      {"no tensors but data", with_header("{}", 8), "8 bytes belong to no tensor"},
      {"header not starting with a brace", with_header(" {" + a + "}", 8), "does not start with '{'"},
  };
  for (const MalformedCase& c : cases) {
    SCOPED_TRACE(c.what);
    const std::string path = dir.file("bad.safetensors");
    test::write_bytes(path, c.bytes);
    expect_error([&] { SafetensorsReader r(path); }, "safetensors", {path, c.expected});
  }
}

// The campaign's case: a header length field 4 bytes short still parses (the JSON ends in
// padding spaces), and every tensor would be read one float early.
TEST(SafetensorsReader, RefusesAHeaderLengthFieldFourBytesShort) {
  ScratchDir dir;
  const std::string path = dir.file("short.safetensors");
  std::string header = R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  header.append((8 - header.size() % 8) % 8 + 8, ' ');
  const std::string data = bytes_of<float>({1.5f, 2.5f});
  test::write_bytes(path, safetensors_bytes(header, data));
  float x[2] = {};
  SafetensorsReader(path).read_f32("x", Shape{2}, x);  // the intact file reads
  EXPECT_EQ(x[1], 2.5f);
  test::write_bytes(path, le_u64(header.size() - 4) + header + data);
  expect_error([&] { SafetensorsReader r(path); }, "safetensors",
               {path, "4 bytes belong to no tensor", "header length field " + std::to_string(header.size() - 4)});
}

// Reading a tensor gives the file's pages back as it goes: RSS after reading 96 MiB of
// weights grows by the destination only, not by the mapped file (which --load would otherwise
// keep resident on top of the planned arena until the reader closes).
TEST(SafetensorsReader, GivesTheFilePagesBackAsTensorsAreRead) {
  ScratchDir dir;
  const std::string path = dir.file("big.safetensors");
  constexpr int64_t kRows = 2048, kCols = 4096;  // 32 MiB each as F32
  std::vector<float> values(size_t(kRows * kCols));
  for (size_t i = 0; i < values.size(); ++i) values[i] = float(i % 1000);
  const SafetensorsTensor tensors[] = {{"a", DType::f32, Shape{kRows, kCols}, values.data()},
                                       {"b", DType::f32, Shape{kRows, kCols}, values.data()},
                                       {"c", DType::f32, Shape{kRows, kCols}, values.data()}};
  write_safetensors(path, tensors);
  std::vector<float> dst(values.size(), -1.0f);  // touched: resident before the measurement
  const SafetensorsReader reader(path);
  const uint64_t before = resident_set_bytes();
  ASSERT_GT(before, 0u);
  reader.read_f32("a", Shape{kRows, kCols}, dst.data());
  EXPECT_EQ(dst, values);
  reader.read_f32("b", Shape{kRows, kCols}, dst.data(), /*transpose2d=*/true);
  EXPECT_EQ(dst[1], values[size_t(kCols)]);  // dst[0][1] = src[1][0]
  reader.read_f32("c", Shape{kRows, kCols}, dst.data());
  const uint64_t grown = resident_set_bytes() - std::min(before, resident_set_bytes());
  // One chunk (4 MiB of F32) and a few pages may stay; the whole file would be 96 MiB.
  EXPECT_LT(grown, uint64_t(8) << 20) << "RSS grew by " << grown << " bytes while reading 96 MiB";
}

// --- writer -------------------------------------------------------------------------------

TEST(SafetensorsWriter, WritesTheExpectedBytesForOneTensor) {
  ScratchDir dir;
  const std::string path = dir.file("one.safetensors");
  const float a[] = {1.0f, 2.0f};
  const SafetensorsTensor t{"a", DType::f32, Shape{2}, a};
  write_safetensors(path, std::span(&t, 1));
  // 54 bytes of JSON padded with 2 spaces to 56, so that 8 + 56 is a multiple of 8.
  const std::string header = R"({"a":{"data_offsets":[0,8],"dtype":"F32","shape":[2]}})";
  ASSERT_EQ(header.size(), 54u);
  EXPECT_EQ(test::read_bytes(path), le_u64(56) + header + "  " + bytes_of<float>({1.0f, 2.0f}));
}

TEST(SafetensorsWriter, LaysOutTensorsAsHfDoes) {
  ScratchDir dir;
  const std::string path = dir.file("layout.safetensors");
  const float z[] = {1, 2}, b[] = {3, 4};
  const uint8_t u[] = {7, 8, 9};
  const uint16_t m[] = {0x3F80, 0x4000};
  const int32_t s[] = {-5};
  const std::vector<SafetensorsTensor> tensors = {
      {"z.f32", DType::f32, Shape{2}, z},       {"a.u8", DType::u8, Shape{3}, u},
      {"m.bf16", DType::bf16, Shape{2, 1}, m},  {"b.f32", DType::f32, Shape{1, 2}, b},
      {"scalar", DType::i32, Shape{}, s},
  };
  write_safetensors(path, tensors, {{"format", "pt"}});

  const std::string bytes = test::read_bytes(path);
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  ASSERT_LE(8 + n, bytes.size());
  EXPECT_EQ((8 + n) % 8, 0u);
  const std::string header = bytes.substr(8, n);
  const std::string data = bytes.substr(8 + n);
  const size_t json_end = header.find_last_of('}') + 1;
  EXPECT_EQ(header.substr(json_end), std::string(n - json_end, ' '));  // padding is spaces only

  // Keys appear sorted in the text.
  std::vector<size_t> positions;
  for (const char* key : {"\"__metadata__\"", "\"a.u8\"", "\"b.f32\"", "\"m.bf16\"", "\"scalar\"", "\"z.f32\""})
    positions.push_back(header.find(key));
  EXPECT_TRUE(std::is_sorted(positions.begin(), positions.end())) << header;
  EXPECT_EQ(std::count(positions.begin(), positions.end(), std::string::npos), 0);

  // Data: 4-byte elements first, then 2-byte, then 1-byte, each group by name; no gaps.
  const nlohmann::json j = nlohmann::json::parse(header);
  EXPECT_EQ(j["__metadata__"], nlohmann::json({{"format", "pt"}}));
  const auto offsets = [&](const char* name) { return j[name]["data_offsets"].get<std::vector<uint64_t>>(); };
  EXPECT_EQ(offsets("b.f32"), (std::vector<uint64_t>{0, 8}));
  EXPECT_EQ(offsets("scalar"), (std::vector<uint64_t>{8, 12}));
  EXPECT_EQ(offsets("z.f32"), (std::vector<uint64_t>{12, 20}));
  EXPECT_EQ(offsets("m.bf16"), (std::vector<uint64_t>{20, 24}));
  EXPECT_EQ(offsets("a.u8"), (std::vector<uint64_t>{24, 27}));
  EXPECT_EQ(data.size(), 27u);
  EXPECT_EQ(j["m.bf16"]["dtype"], "BF16");
  EXPECT_EQ(j["m.bf16"]["shape"], nlohmann::json({2, 1}));
  EXPECT_EQ(j["scalar"]["shape"], nlohmann::json::array());
  EXPECT_EQ(j["scalar"]["dtype"], "I32");
  EXPECT_EQ(j["a.u8"]["dtype"], "U8");
  EXPECT_EQ(data.substr(0, 8), bytes_of<float>({3, 4}));
  EXPECT_EQ(data.substr(8, 4), bytes_of<int32_t>({-5}));
  EXPECT_EQ(data.substr(12, 8), bytes_of<float>({1, 2}));
  EXPECT_EQ(data.substr(20, 4), bytes_of<uint16_t>({0x3F80, 0x4000}));
  EXPECT_EQ(data.substr(24, 3), "\x07\x08\x09");
}

TEST(SafetensorsWriter, RoundTripsThroughTheReader) {
  ScratchDir dir;
  const std::string path = dir.file("rt.safetensors");
  std::vector<float> w(12);
  for (size_t i = 0; i < w.size(); ++i) w[i] = float(i) * 0.5f - 2.0f;
  const int8_t q[] = {-128, 0, 127};
  const std::vector<SafetensorsTensor> tensors = {{"h.0.attn.c_attn.weight", DType::f32, Shape{3, 4}, w.data()},
                                                  {"q", DType::i8, Shape{3}, q}};
  write_safetensors(path, tensors, {{"step", "42"}, {"format", "pt"}});
  SafetensorsReader r(path);
  EXPECT_EQ(r.metadata().at("step"), "42");
  EXPECT_EQ(r.entries().size(), 2u);
  std::vector<float> back(12);
  r.read_f32("h.0.attn.c_attn.weight", Shape{3, 4}, back.data());
  EXPECT_EQ(back, w);
  EXPECT_EQ(std::memcmp(r.data(*r.find("q")), q, 3), 0);
  EXPECT_EQ(r.find("q")->dtype, DType::i8);
}

void expect_file_unchanged(const std::string& path, const std::string& before) {
  EXPECT_EQ(test::read_bytes(path), before);
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp")) << "temporary file left behind";
}

TEST(SafetensorsWriter, RefusesInvalidTensorsAndKeepsTheExistingFile) {
  ScratchDir dir;
  const std::string path = dir.file("keep.safetensors");
  const float one[] = {1.0f};
  const SafetensorsTensor good{"good", DType::f32, Shape{1}, one};
  write_safetensors(path, std::span(&good, 1));
  const std::string before = test::read_bytes(path);

  const std::vector<std::pair<std::vector<SafetensorsTensor>, std::string>> cases = {
      {{good, good}, "given twice"},
      {{{"", DType::f32, Shape{1}, one}}, "invalid tensor name"},
      {{{"__metadata__", DType::f32, Shape{1}, one}}, "invalid tensor name"},
      {{{"packed", DType::nf4, Shape{2}, one}}, "safetensors cannot store"},
      {{good, {"missing", DType::f32, Shape{4}, nullptr}}, "has no data"},
  };
  for (const auto& c : cases) {
    const auto& tensors = c.first;  // not a structured binding: clang 14 cannot capture those
    const auto& expected = c.second;
    SCOPED_TRACE(expected);
    expect_error([&] { write_safetensors(path, tensors); }, "safetensors", {path, expected});
    expect_file_unchanged(path, before);
  }
  expect_error([&] { write_safetensors(path, std::span(&good, 1), {{"bad", "\xff"}}); }, "safetensors", {"UTF-8"});
  expect_file_unchanged(path, before);
}

TEST(SafetensorsWriter, KeepsTheExistingFileWhenTheDiskFillsMidWrite) {
  // RLIMIT_FSIZE makes write() fail with EFBIG past 64 KiB, as a full disk would fail it.
  ScratchDir dir;
  const std::string path = dir.file("full.safetensors");
  const float one[] = {1.0f};
  const SafetensorsTensor small{"small", DType::f32, Shape{1}, one};
  write_safetensors(path, std::span(&small, 1));
  const std::string before = test::read_bytes(path);

  std::vector<float> big(1 << 20, 3.0f);  // 4 MiB
  const SafetensorsTensor large{"large", DType::f32, Shape{int64_t(big.size())}, big.data()};
  rlimit saved{};
  ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &saved), 0);
  rlimit limited = saved;
  limited.rlim_cur = 64 * 1024;
  const auto old_handler = signal(SIGXFSZ, SIG_IGN);
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &limited), 0);
  std::string message;
  try {
    write_safetensors(path, std::span(&large, 1));
  } catch (const Error& e) {
    message = e.what();
  }
  setrlimit(RLIMIT_FSIZE, &saved);
  signal(SIGXFSZ, old_handler);
  EXPECT_NE(message.find("write failed"), std::string::npos) << message;
  EXPECT_NE(message.find(path), std::string::npos) << message;
  expect_file_unchanged(path, before);
}

TEST(SafetensorsWriter, ReportsAnUncreatableFileAndReplacesOnSuccess) {
  ScratchDir dir;
  const float one[] = {1.0f}, two[] = {2.0f};
  const SafetensorsTensor t{"t", DType::f32, Shape{1}, one};
  const std::string missing_dir = dir.file("no-such-dir/x.safetensors");
  expect_error([&] { write_safetensors(missing_dir, std::span(&t, 1)); }, "safetensors", {missing_dir, "cannot create"});

  const std::string path = dir.file("x.safetensors");
  write_safetensors(path, std::span(&t, 1));
  const SafetensorsTensor t2{"t", DType::f32, Shape{1}, two};
  write_safetensors(path, std::span(&t2, 1));
  float back = 0;
  SafetensorsReader(path).read_f32("t", Shape{1}, &back);
  EXPECT_EQ(back, 2.0f);
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
}

TEST(SafetensorsWriter, KeepsTheExistingFileInAReadOnlyDirectory) {
  if (geteuid() == 0) GTEST_SKIP() << "root ignores directory permissions";
  ScratchDir dir;
  const std::string path = dir.file("ro.safetensors");
  const float one[] = {1.0f};
  const SafetensorsTensor t{"t", DType::f32, Shape{1}, one};
  write_safetensors(path, std::span(&t, 1));
  const std::string before = test::read_bytes(path);
  std::filesystem::permissions(dir.path(), std::filesystem::perms::owner_read | std::filesystem::perms::owner_exec);
  expect_error([&] { write_safetensors(path, std::span(&t, 1)); }, "safetensors", {path, "cannot create"});
  std::filesystem::permissions(dir.path(), std::filesystem::perms::owner_all);
  expect_file_unchanged(path, before);
}

}  // namespace
}  // namespace memfit
