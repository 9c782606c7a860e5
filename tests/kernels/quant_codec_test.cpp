// kernels/quant codecs against bitsandbytes 0.50 (tests/fixtures/quant/bnb.safetensors, made by
// tools/gen_quant_fixtures.py), bit for bit: NF4 / FP4 codes and absmax of bf16 and fp32
// weights (zeros, equal values, subnormals, absmax ties, values on and next to the code
// midpoints, partial last blocks, blocks 32 to 4096), the double-quantisation fields, all three
// of bnb's dequantisation paths (torch, AVX-512, scalar), bnb's row-wise int8, torch's fp32 mean (on 1 to 8 threads);
// storage sizes against
// their closed forms; bad input refused with [kernels].
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "io/safetensors.hpp"
#include "kernels/quant/blockwise.hpp"
#include "support/paths.hpp"

namespace memfit {
namespace {

const SafetensorsReader& fixture() {
  static const SafetensorsReader reader(test::fixture_path("quant/bnb.safetensors"));
  return reader;
}

bool has(const std::string& name) { return fixture().find(name) != nullptr; }

template <class T>
std::vector<T> load(const std::string& name) {
  const SafetensorsEntry* e = fixture().find(name);
  if (e == nullptr) throw Error("test", "fixture has no tensor " + name);
  EXPECT_EQ(e->bytes() % sizeof(T), 0u) << name;
  std::vector<T> v(e->bytes() / sizeof(T));
  std::memcpy(v.data(), fixture().data(*e), e->bytes());
  return v;
}

int64_t block_of(const std::string& c) { return std::stoll(fixture().metadata().at(c + ".block")); }

// Bit patterns, so that -0 / +0 and NaN payloads count as different.
template <class T>
std::vector<uint32_t> bits(const std::vector<T>& v) {
  std::vector<uint32_t> out;
  for (const T& x : v) {
    uint32_t b = 0;
    std::memcpy(&b, &x, sizeof(T));
    out.push_back(b);
  }
  return out;
}

template <class T>
void expect_bits_equal(const std::vector<T>& got, const std::vector<T>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  const auto g = bits(got), w = bits(want);
  int64_t wrong = 0, first = -1;
  for (size_t i = 0; i < g.size(); ++i)
    if (g[i] != w[i]) {
      if (first < 0) first = int64_t(i);
      ++wrong;
    }
  EXPECT_EQ(wrong, 0) << what << ": " << wrong << " of " << g.size() << " differ, first at " << first << " (got 0x"
                      << std::hex << (first >= 0 ? g[size_t(first)] : 0) << ", bnb 0x"
                      << (first >= 0 ? w[size_t(first)] : 0) << ")";
}

struct Quantized {
  std::vector<uint8_t> codes;
  std::vector<float> absmax;
};

template <class T>
Quantized quantize(const std::vector<T>& w, const QuantSpec& spec) {
  Quantized q;
  q.codes.resize((w.size() + 1) / 2);
  q.absmax.resize(size_t(quant_blocks(int64_t(w.size()), spec.block)));
  quantize_4bit<T>(w, spec, q.codes, q.absmax);
  return q;
}

// One fixture case: quantise its weight, double-quantise the absmax, dequantise both ways.
template <class T>
void check_case(const std::string& c, QuantKind kind) {
  const std::string q = c + "." + quant_kind_name(kind);
  const std::vector<T> w = load<T>(c + ".w");
  const SafetensorsEntry& entry = *fixture().find(c + ".w");
  const QuantSpec spec{kind, block_of(c), false};
  const Quantized mine = quantize(w, spec);
  expect_bits_equal(mine.codes, load<uint8_t>(q + ".codes"), q + " codes");
  expect_bits_equal(mine.absmax, load<float>(q + ".absmax"), q + " absmax");

  QuantizedWeight plain{spec, entry.shape[0], entry.shape[1], mine.codes, mine.absmax, {}, {}, 0.0f};
  if (has(q + ".dequant")) {
    std::vector<T> out(w.size());
    dequantize_range<T>(plain, 0, int64_t(w.size()), out);
    expect_bits_equal(out, load<T>(q + ".dequant"), q + " dequantised");
  }

  std::vector<uint8_t> absmax_codes(mine.absmax.size());
  std::vector<float> absmax2(size_t(quant_blocks(int64_t(mine.absmax.size()), kDoubleQuantBlock)));
  const float offset = double_quantize_absmax(mine.absmax, absmax_codes, absmax2);
  expect_bits_equal(std::vector<float>{offset}, load<float>(q + ".dq.offset"), q + " double-quant offset");
  expect_bits_equal(absmax_codes, load<uint8_t>(q + ".dq.absmax_codes"), q + " double-quant codes");
  expect_bits_equal(absmax2, load<float>(q + ".dq.absmax2"), q + " double-quant absmax2");
  QuantizedWeight dq{{kind, spec.block, true}, entry.shape[0], entry.shape[1], mine.codes, {}, absmax_codes,
                     absmax2, offset};
  std::vector<T> out(w.size());
  dequantize_range<T>(dq, 0, int64_t(w.size()), out);
  if (has(q + ".dq.dequant")) expect_bits_equal(out, load<T>(q + ".dq.dequant"), q + " double-quant dequantised");

  // A range that starts and ends inside blocks and on odd elements decodes the same values.
  const int64_t begin = 33, end = int64_t(w.size()) - 7;
  std::vector<T> part(size_t(end - begin));
  dequantize_range<T>(dq, begin, end, part);
  expect_bits_equal(part, std::vector<T>(out.begin() + begin, out.begin() + end), q + " range");
}

TEST(BnbCodec, DynamicMapIsBitsandbytes) {
  const QuantMap& map = bnb_dynamic_map_signed();
  expect_bits_equal(std::vector<float>(map.begin(), map.end()), load<float>("dynamic_map"), "dynamic map");
}

TEST(BnbCodec, Bf16WeightsMatchBitsandbytes) {
  for (const char* c : {"awkward", "awkward32", "random", "big_block", "block128", "avx512_path"})
    for (QuantKind kind : {QuantKind::nf4, QuantKind::fp4}) {
      SCOPED_TRACE(std::string(c) + " " + quant_kind_name(kind));
      check_case<bf16_t>(c, kind);
    }
}

TEST(BnbCodec, Fp32WeightsWithExactMidpointsMatchBitsandbytes) {
  for (QuantKind kind : {QuantKind::nf4, QuantKind::fp4}) {
    check_case<float>("awkward_f32", kind);
    check_case<float>("avx512_path_f32", kind);
  }
}

TEST(BnbCodec, DynamicBlockwiseTiesMatchBitsandbytes) {
  const std::vector<float> values = load<float>("blockwise8.values");
  std::vector<uint8_t> codes(values.size());
  std::vector<float> absmax(size_t(quant_blocks(int64_t(values.size()), 256)));
  quantize_dynamic_blockwise(values, 0.0f, 256, codes, absmax);
  expect_bits_equal(codes, load<uint8_t>("blockwise8.codes"), "8-bit codes");
  expect_bits_equal(absmax, load<float>("blockwise8.absmax"), "8-bit absmax");
}

TEST(BnbCodec, TorchMeanOrder) {
  for (int n : {3, 7, 8, 9, 15, 16, 17, 33, 64, 100, 257, 515, 1000, 2100}) {
    const std::string name = "mean" + std::to_string(n);
    const std::vector<float> values = load<float>(name + ".values");
    expect_bits_equal(std::vector<float>{torch_float_mean(values)}, load<float>(name + ".mean"), name);
  }
}

TEST(BnbCodec, TorchMeanSplitOverThreads) {
  for (int64_t n : {32768, 40000, 70001, 262144}) {
    std::vector<float> values(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
      const uint32_t h = uint32_t(uint64_t(i) * 2654435761u);
      values[size_t(i)] = (float(h) * 0x1p-32f) * 3.0f;
    }
    for (int threads : {1, 2, 3, 8}) {
      const std::string name = "mean_hashed" + std::to_string(n) + ".threads" + std::to_string(threads);
      expect_bits_equal(std::vector<float>{torch_float_mean(values, threads)}, load<float>(name), name);
    }
  }
}

TEST(BnbCodec, Int8RowwiseMatchesBitsandbytes) {
  const std::vector<bf16_t> w = load<bf16_t>("int8.w");
  const QuantSpec spec{QuantKind::int8, block_of("int8"), false};
  std::vector<uint8_t> codes(w.size());
  std::vector<float> absmax(size_t(quant_blocks(int64_t(w.size()), spec.block)));
  quantize_int8<bf16_t>(w, spec, codes, absmax);
  expect_bits_equal(codes, load<uint8_t>("int8.int8.codes"), "int8 codes");
  expect_bits_equal(absmax, load<float>("int8.int8.absmax"), "int8 absmax");
  const SafetensorsEntry& entry = *fixture().find("int8.w");
  QuantizedWeight qw{spec, entry.shape[0], entry.shape[1], codes, absmax, {}, {}, 0.0f};
  std::vector<float> out(w.size());
  dequantize_range<float>(qw, 0, int64_t(w.size()), out);
  expect_bits_equal(out, load<float>("int8.int8.dequant"), "int8 dequantised");
}

TEST(BnbCodec, StorageClosedForms) {
  const QuantSpec nf4_dq{QuantKind::nf4, 64, true};
  const double closed = 4.0 + 8.0 / 64 + 32.0 / (64 * 256);
  EXPECT_EQ(quant_bits_per_parameter(nf4_dq), closed);
  EXPECT_NEAR(quant_bits_per_parameter(nf4_dq), 4.127, 5e-4);
  EXPECT_EQ(quant_bits_per_parameter({QuantKind::fp4, 64, false}), 4.5);
  EXPECT_EQ(quant_bits_per_parameter({QuantKind::int8, 128, false}), 8.25);
  // Whole second-level blocks: exactly the closed form plus the one fp32 offset per tensor.
  const int64_t numel = 64 * 256 * 12;
  const QuantStorage s = quant_storage(nf4_dq, numel);
  EXPECT_EQ(double(s.total()) * 8.0 / double(numel), closed + 32.0 / double(numel));
  // Partial blocks round up: 1001 elements at block 64 are 16 blocks, 501 code bytes.
  const QuantStorage p = quant_storage({QuantKind::nf4, 64, true}, 1001);
  EXPECT_EQ(p.codes, 501u);
  EXPECT_EQ(p.absmax, 16u);
  EXPECT_EQ(p.absmax2, 4u);
  EXPECT_EQ(p.offset, 4u);
  EXPECT_EQ(quant_storage({QuantKind::fp4, 32, false}, 1001).absmax, 32u * 4);
  EXPECT_EQ(quant_storage({QuantKind::int8, 64, false}, 1001).total(), 1001u + 16 * 4);
}

template <class F>
void expect_kernels_error(F&& f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "no error; expected one mentioning '" << needle << "'";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_EQ(what.rfind("[kernels]", 0), 0u) << what;
    EXPECT_NE(what.find(needle), std::string::npos) << what;
  }
}

TEST(BnbCodec, BadInputIsRefused) {
  std::vector<float> w(100, 1.0f);
  std::vector<uint8_t> codes(50);
  std::vector<float> absmax(2);
  for (int64_t block : {0, 16, 48, 96, 8192})
    expect_kernels_error([&] { quantize_4bit<float>(w, {QuantKind::nf4, block, false}, codes, absmax); },
                         "block size " + std::to_string(block) + " is not supported");
  expect_kernels_error([&] { quant_storage({QuantKind::int8, 64, true}, 64); }, "double quantisation");
  expect_kernels_error([&] { quantize_4bit<float>(w, {QuantKind::int8, 64, false}, codes, absmax); }, "int8");
  std::vector<uint8_t> short_codes(49);
  expect_kernels_error([&] { quantize_4bit<float>(w, {QuantKind::nf4, 64, false}, short_codes, absmax); },
                       "has 49 elements, expected 50");
  std::vector<float> one_absmax(1);
  expect_kernels_error([&] { quantize_4bit<float>(w, {QuantKind::fp4, 64, false}, codes, one_absmax); },
                       "has 1 elements, expected 2");
  // A weight whose spans do not fit its shape, and a range outside it.
  QuantizedWeight qw{{QuantKind::nf4, 64, false}, 10, 10, codes, absmax, {}, {}, 0.0f};
  std::vector<float> out(100);
  dequantize_range<float>(qw, 0, 100, out);
  qw.rows = 11;
  expect_kernels_error([&] { dequantize_range<float>(qw, 0, 100, out); }, "codes has 50 bytes");
  qw.rows = 10;
  expect_kernels_error([&] { dequantize_range<float>(qw, 90, 101, std::span<float>(out).first(11)); },
                       "[90, 101)");
}

}  // namespace
}  // namespace memfit
