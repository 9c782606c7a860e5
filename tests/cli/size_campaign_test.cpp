// The size campaign as a test: 150 seeded random models and batch shapes, from tiny to absurd
// (every size log-uniform, up to 2^34 at the largest scale), each planned by `memfit plan --json` through the
// binary. Each one either plans with positive, consistent figures or is refused with one line
// and exit status 1, never a signal and never an overflowed figure. An independent oracle
// (128-bit arithmetic over the published bounds) says which: a size it finds out of bounds must
// be refused naming one of the fields it finds at fault; a size it finds in bounds must plan,
// unless the plan (or one tensor) needs more than 1 PiB, which the refusal must show.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "support/run_cli.hpp"

namespace memfit {
namespace {

using i128 = __int128;
constexpr int64_t kDimBound = 2147483647;                  // kMaxKernelDim, and HF config integers
constexpr int64_t kLayerBound = 10'000;                    // kMaxLayers
constexpr i128 kParameterBound = i128(1) << 50;            // kMaxParameters
constexpr i128 kTierBytes = i128(1) << 50;                 // kMaxTierBytes

struct Case {
  bool llama = false;
  int64_t layers = 1, heads = 1, kv_heads = 1, embd = 1, inner = 0, vocab = 1, positions = 1;  // inner 0: 4C (gpt2)
  int64_t batch = 1, seq = 1;
  bool flash = false;

  std::string config() const {
    nlohmann::json j;
    if (llama) {
      j = {{"model_type", "llama"},         {"num_hidden_layers", layers}, {"num_attention_heads", heads},
           {"num_key_value_heads", kv_heads}, {"hidden_size", embd},       {"intermediate_size", inner},
           {"vocab_size", vocab},           {"max_position_embeddings", positions}};
    } else {
      j = {{"model_type", "gpt2"}, {"n_layer", layers}, {"n_head", heads}, {"n_embd", embd},
           {"vocab_size", vocab},  {"n_positions", positions}};
      if (inner > 0) j["n_inner"] = inner;
    }
    return j.dump();
  }
  std::string describe() const { return config() + fmt_args(); }
  std::string fmt_args() const {
    return " --batch " + std::to_string(batch) + " --seq " + std::to_string(seq) + (flash ? " --attention flash" : "");
  }
};

// The oracle: the fields at fault (words the refusal must contain one of), and the parameter
// count when the model is in bounds.
struct Verdict {
  std::vector<std::string> faults;
  i128 parameters = 0;
};

Verdict judge(const Case& c) {
  Verdict v;
  auto fault = [&](bool bad, const std::string& word) {
    if (bad) v.faults.push_back(word);
  };
  const std::map<std::string, int64_t> keys =
      c.llama ? std::map<std::string, int64_t>{{"num_hidden_layers", c.layers}, {"num_attention_heads", c.heads},
                                               {"num_key_value_heads", c.kv_heads}, {"hidden_size", c.embd},
                                               {"intermediate_size", c.inner}, {"vocab_size", c.vocab},
                                               {"max_position_embeddings", c.positions}}
              : std::map<std::string, int64_t>{{"n_layer", c.layers}, {"n_head", c.heads}, {"n_embd", c.embd},
                                               {"vocab_size", c.vocab}, {"n_positions", c.positions},
                                               {"n_inner", c.inner > 0 ? c.inner : 1}};
  for (const auto& [key, value] : keys) fault(value > kDimBound, key);  // the config reader's bound
  fault(c.batch > kDimBound, "--batch");
  fault(c.seq > kDimBound, "--seq");
  if (!v.faults.empty()) return v;
  const i128 C = c.embd, F = c.inner > 0 ? c.inner : 4 * i128(c.embd), L = c.layers;
  const i128 Vp = (i128(c.vocab) + 63) / 64 * 64;
  fault(c.layers > kLayerBound, "n_layer");
  fault(F > kDimBound, "n_inner");
  fault(Vp > kDimBound, "padded_vocab");
  fault(c.embd % c.heads != 0, "heads");
  fault(c.llama && c.heads % c.kv_heads != 0, "heads");
  if (!v.faults.empty()) return v;
  const i128 HS = C / c.heads, KV = c.llama ? c.kv_heads : c.heads;
  const i128 qkv = c.llama ? (c.heads + 2 * KV) * HS : 3 * C;
  fault(qkv > kDimBound, "q/k/v");
  const i128 per_layer = c.llama ? qkv * C + C * C + 3 * C * F + 2 * C : qkv * C + C * C + 2 * C * F + 9 * C + F;
  v.parameters = c.llama ? 2 * Vp * C + L * per_layer + C : Vp * C + i128(c.positions) * C + L * per_layer + 2 * C;
  fault(v.parameters > kParameterBound, "parameter");
  if (!v.faults.empty()) return v;
  fault(c.seq > c.positions, "exceeds the context");
  fault(i128(c.batch) * c.seq > kDimBound, "batch x sequence length");
  fault(!c.flash && i128(c.batch) * c.heads * c.seq * c.seq * 4 > kTierBytes, "plain attention");
  return v;
}

// The first integer after `after` in `text` (0 when absent).
i128 number_after(const std::string& text, const std::string& after) {
  const size_t at = text.find(after);
  if (at == std::string::npos) return 0;
  i128 n = 0;
  for (size_t i = at + after.size(); i < text.size() && std::isdigit(static_cast<unsigned char>(text[i])); ++i)
    n = n * 10 + (text[i] - '0');
  return n;
}

int64_t log_uniform(std::mt19937_64& rng, int max_log2) {
  const double u = std::uniform_real_distribution<double>(0, max_log2)(rng);
  return std::max<int64_t>(1, int64_t(std::exp2(u)));
}

// Three scales in turn: small (trainable here), large (real models and a bit beyond: the
// campaign's "large but in range"), absurd (every size up to 2^34).
Case draw(std::mt19937_64& rng, int scale) {
  struct Limits {
    int layers, heads, head_size, inner, vocab, positions, batch;
  };
  constexpr Limits kScales[] = {{4, 3, 6, 10, 12, 10, 4}, {14, 8, 12, 22, 24, 22, 16}, {34, 12, 24, 34, 34, 34, 34}};
  const Limits& m = kScales[scale];
  Case c;
  c.llama = rng() % 2;
  c.layers = log_uniform(rng, m.layers);
  c.heads = log_uniform(rng, m.heads);
  c.kv_heads = rng() % 3 == 0 ? log_uniform(rng, m.heads) : std::max<int64_t>(1, c.heads >> (rng() % 4));
  // Mostly head-size multiples of the head count (valid), sometimes any width.
  c.embd = rng() % 8 == 0 ? log_uniform(rng, m.heads + m.head_size) : c.heads * log_uniform(rng, m.head_size);
  c.inner = c.llama || rng() % 2 ? log_uniform(rng, m.inner) : 0;
  c.vocab = log_uniform(rng, m.vocab);
  c.positions = log_uniform(rng, m.positions);
  c.batch = log_uniform(rng, m.batch);
  c.seq = rng() % 5 == 0 ? log_uniform(rng, m.positions) : std::min(c.positions, log_uniform(rng, m.positions));
  c.flash = rng() % 2;
  return c;
}

TEST(SizeCampaign, EverySizePlansConsistentlyOrIsRefusedInOneLine) {
  std::mt19937_64 rng(150);
  int planned = 0, refused = 0, too_large = 0;
  for (int i = 0; i < 150; ++i) {
    const Case c = draw(rng, i % 3);
    SCOPED_TRACE(c.describe());
    const std::string path = test::temp_dir() + "/campaign" + std::to_string(i) + ".json";
    test::write_file(path, c.config());
    const test::CliResult r = test::run_memfit("plan --json --val-fraction 0 --model " + path + c.fmt_args());
    const Verdict v = judge(c);
    if (r.status != 0) {
      ASSERT_EQ(r.status, 1) << "not a one-line refusal (a signal is 128 + its number): " << r.err;
      EXPECT_EQ(r.err.rfind("memfit: error: [", 0), 0u) << r.err;
      EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
      if (v.faults.empty()) {
        // In bounds, but more memory than any machine: the refusal shows a figure above 1 PiB
        // (one tensor, or the whole tier), or says that the tier's bytes overflow 64 bits.
        const bool tensor = r.err.find("[graph] tensor '") != std::string::npos &&
                            (number_after(r.err, "needs ") > kTierBytes || r.err.find("needs over 2^64") != std::string::npos);
        const bool tier = r.err.find("[plan] the device tier needs ") != std::string::npos &&
                          number_after(r.err, " (") > kTierBytes;
        const bool beyond_64_bits = r.err.find("[plan] bytes of one tier's buffers") != std::string::npos &&
                                    r.err.find("overflows 64-bit") != std::string::npos;
        EXPECT_TRUE(tensor || tier || beyond_64_bits) << "refused a size in bounds: " << r.err;
        ++too_large;
      } else {
        const bool named = std::any_of(v.faults.begin(), v.faults.end(),
                                       [&](const std::string& f) { return r.err.find(f) != std::string::npos; });
        EXPECT_TRUE(named) << "the refusal names none of " << ::testing::PrintToString(v.faults) << ": " << r.err;
        ++refused;
      }
      continue;
    }
    EXPECT_TRUE(v.faults.empty()) << "planned although out of bounds (" << ::testing::PrintToString(v.faults) << ")";
    const auto j = nlohmann::json::parse(r.out);
    const int64_t params = j["model"]["parameters"].get<int64_t>();
    EXPECT_EQ(i128(params), v.parameters);
    const auto& mem = j["memory"];
    const uint64_t peak = mem["planned_peak_bytes"]["device"].get<uint64_t>();
    EXPECT_GT(peak, 0u);
    EXPECT_LE(i128(peak), kTierBytes);
    EXPECT_GT(i128(peak), 12 * i128(params));  // fp32 weights and both AdamW moments are always live
    EXPECT_EQ(mem["optimizer_state_bytes"].get<uint64_t>(), 8 * uint64_t(params));
    uint64_t sum = mem["planned_free_at_peak_bytes"].get<uint64_t>();
    for (const auto& [category, bytes] : mem["planned_by_category"].items()) sum += bytes.get<uint64_t>();
    EXPECT_EQ(sum, peak);
    ++planned;
  }
  std::printf("size campaign: %d planned, %d refused by a bound, %d refused as larger than 1 PiB\n", planned,
              refused, too_large);
  // The draw covers both sides of the bounds.
  EXPECT_GE(planned, 30);
  EXPECT_GE(refused, 50);
}

// The campaign's specific crashes, under `plan` and `train` alike.
TEST(SizeCampaign, TheSizesThatCrashedAreRefusedInOneLine) {
  const std::string d = test::temp_dir();
  test::write_file(d + "/embd30.json", R"({"model_type": "gpt2", "n_layer": 1, "n_head": 1, "n_embd": 1073741824,
                                           "vocab_size": 256, "n_positions": 256})");
  test::write_file(d + "/embd31.json", R"({"model_type": "gpt2", "n_layer": 1, "n_head": 1, "n_embd": 2147483584,
                                           "vocab_size": 256, "n_positions": 256})");
  test::write_file(d + "/long.json", R"({"model_type": "gpt2", "n_layer": 1, "n_head": 4, "n_embd": 128,
                                         "vocab_size": 256, "n_positions": 65536})");
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"--model " + d + "/embd30.json --batch 1 --seq 8", "n_inner"},
      {"--model " + d + "/embd31.json --batch 1 --seq 8", "n_inner"},
      {"--model " + d + "/long.json --batch 65536 --seq 65536 --attention flash", "batch x sequence length"},
      {"--model " + d + "/long.json --batch 131072 --seq 65536 --attention flash", "batch x sequence length"},
      {"--batch 99999999999999999999999", "--batch"},
  };
  for (const auto& [args, field] : cases) {
    for (const char* command : {"plan ", "train --steps 1 "}) {
      const test::CliResult r = test::run_memfit(command + args);
      SCOPED_TRACE(command + args);
      EXPECT_EQ(r.status, 1) << r.err;
      EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
      EXPECT_NE(r.err.find(field), std::string::npos) << r.err;
    }
  }
}

}  // namespace
}  // namespace memfit
