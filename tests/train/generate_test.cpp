// memfit generate (train/generate.hpp) against transformers: greedy generate of 32 new tokens
// equals model.generate(do_sample=False) token for token on the tiny fixtures
// (tools/make_generate_fixtures.py: GPT-2, Llama with GQA, Llama 3.1 rope scaling); each
// decode's logits equal a full forward's last-position logits (the training forward, plain
// attention, no cache); planned == measured on every tier and the token loop allocates
// nothing; sampling is reproducible from the seed; bad input is one line.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <sstream>

#include "core/error.hpp"
#include "graph/builder.hpp"
#include "graph/forward_rewrite.hpp"
#include "graph/inference_program.hpp"
#include "io/safetensors.hpp"
#include "kernels/backend.hpp"
#include "runtime/compile.hpp"
#include "support/alloc_counter.hpp"
#include "support/paths.hpp"
#include "support/run_cli.hpp"
#include "train/generate.hpp"
#include "train/init.hpp"
#include "train/trainer.hpp"
#include "train/weights.hpp"

namespace memfit {
namespace {

struct Fixture {
  std::vector<int32_t> prompt, tokens;
  std::vector<float> logits;  // [N, V]
  int64_t vocab = 0;
};

std::vector<int32_t> read_ints(const SafetensorsReader& r, const std::string& name) {
  const SafetensorsEntry* e = r.find(name);
  EXPECT_TRUE(e) << name;
  std::vector<int32_t> v(size_t(e->shape.numel()));
  std::memcpy(v.data(), r.data(*e), v.size() * sizeof(int32_t));
  return v;
}

Fixture read_fixture(const std::string& name) {
  SafetensorsReader r(test::fixture_path("generate/" + name + ".safetensors"));
  Fixture f;
  f.prompt = read_ints(r, "prompt");
  f.tokens = read_ints(r, "tokens");
  const SafetensorsEntry* e = r.find("logits");
  f.vocab = e->shape[1];
  f.logits.resize(size_t(e->shape.numel()));
  r.read_f32("logits", e->shape, f.logits.data());
  return f;
}

std::string model_dir(const std::string& name) { return test::fixture_path(name + "_torch"); }

// A planned generate program with the fixture's weights.
struct GenRun {
  GenRun(const std::string& name, int64_t prompt, int64_t capacity, const std::string& backend_name = "cpu",
         Precision precision = Precision::fp32)
      : spec(resolve_model(model_dir(name))), backend(make_backend(backend_name)) {
    Policy policy;
    policy.precision = precision;
    compiled = compile_program(
        build_inference_program(spec, policy, backend->capabilities(), GenerateShape{prompt, capacity}), *backend);
    ex = std::make_unique<Executor>(compiled, *backend);
    TensorStaging staging;
    load_weights(model_dir(name), *ex, spec, staging);
    zero_persistent_state(*ex, staging);
    gen = std::make_unique<Generator>(*ex, spec.vocab_size);
  }
  ModelSpec spec;
  std::unique_ptr<Backend> backend;
  CompiledProgram compiled;
  std::unique_ptr<Executor> ex;
  std::unique_ptr<Generator> gen;
};

// The last position's logits of the training forward (plain attention, no cache) over `tokens`.
std::vector<float> full_forward_logits(const GenRun& run, const std::string& name, const std::vector<int32_t>& tokens) {
  const ModelSpec& spec = run.spec;
  Program p;
  GraphBuilder b(p);
  const ModelParams params = declare_model_parameters(b, spec);
  for (ParamEntry& e : p.params()) freeze_parameter(p, e);
  const TensorId ids = b.persistent("ids", Shape{1, int64_t(tokens.size())}, Category::activations, DType::i32);
  p.begin_section(SectionKind::eval);
  b.set_grad_enabled(false);
  const TensorId hidden = model_forward(b, spec, params, ids, "", AttentionKind::plain);
  const TensorId logits = b.linear("lm_head", hidden, params.classifier_weight, kNoTensor);
  p.end_section();
  p.validate();
  const CompiledProgram c = compile_program(std::move(p), *run.backend);
  Executor ex(c, *run.backend);
  TensorStaging staging;
  load_weights(model_dir(name), ex, spec, staging);
  ex.write_as<int32_t>(c.program.find_tensor("ids"), tokens);
  ex.run_section(SectionKind::eval, StepContext{});
  std::vector<float> out(size_t(spec.vocab_size));
  ex.read_as<float>(logits, int64_t(tokens.size() - 1) * spec.padded_vocab, std::span<float>(out));
  return out;
}

double max_abs_diff(std::span<const float> a, std::span<const float> b) {
  double d = 0;
  for (size_t i = 0; i < a.size(); ++i) d = std::max(d, double(std::fabs(a[i] - b[i])));
  return d;
}

const char* const kModels[] = {"gpt2_tiny", "llama_tiny", "llama31_tiny"};

TEST(Generate, GreedyEqualsTransformersTokenForToken) {
  for (const std::string name : kModels) {
    for (const std::string backend : {"cpu", "reference"}) {
      SCOPED_TRACE(name + " on " + backend);
      const Fixture f = read_fixture(name);
      const int64_t P = int64_t(f.prompt.size()), N = int64_t(f.tokens.size());
      GenRun run(name, P, P + N - 1, backend);
      ASSERT_EQ(run.spec.vocab_size, f.vocab);
      Sampler greedy(SamplingOptions{}, f.vocab);
      std::vector<int32_t> out;
      out.reserve(size_t(N));
      const auto r = run.gen->generate(f.prompt, N, greedy, std::nullopt, out);
      EXPECT_EQ(r.new_tokens, N);
      EXPECT_EQ(out, f.tokens);
      // Each step's logits against transformers' (the run feeds its own tokens, equal to HF's).
      std::span<const float> logits = run.gen->prefill(f.prompt);
      for (int64_t s = 0; s < N; ++s) {
        if (s > 0) logits = run.gen->decode(f.tokens[size_t(s - 1)], P + s - 1);
        EXPECT_LT(max_abs_diff(logits, std::span<const float>(f.logits).subspan(size_t(s * f.vocab), size_t(f.vocab))),
                  2e-5)
            << "step " << s;
      }
    }
  }
}

TEST(Generate, EachDecodeEqualsAFullForwardOverThePrefix) {
  for (const std::string name : kModels) {
    SCOPED_TRACE(name);
    const Fixture f = read_fixture(name);
    const int64_t P = int64_t(f.prompt.size()), N = int64_t(f.tokens.size());
    GenRun run(name, P, P + N - 1);
    std::vector<int32_t> seq = f.prompt;
    std::span<const float> logits = run.gen->prefill(f.prompt);
    for (int64_t s = 0; s < N; ++s) {
      if (s > 0) {
        seq.push_back(f.tokens[size_t(s - 1)]);
        logits = run.gen->decode(seq.back(), int64_t(seq.size()) - 1);
      }
      const std::vector<float> full = full_forward_logits(run, name, seq);
      EXPECT_LT(max_abs_diff(logits, full), 1e-5) << "at " << seq.size() << " tokens";
    }
  }
}

TEST(Generate, PlannedEqualsMeasuredAndTheTokenLoopAllocatesNothing) {
  for (const std::string name : kModels) {
    for (const Precision precision : {Precision::fp32, Precision::bf16}) {
      SCOPED_TRACE(name + " " + std::string(precision_name(precision)));
      const Fixture f = read_fixture(name);
      const int64_t P = int64_t(f.prompt.size());
      GenRun run(name, P, P + 31, "cpu", precision);
      SamplingOptions o;
      o.temperature = 0.8, o.top_k = 40, o.top_p = 0.9, o.seed = 3;
      Sampler sampler(o, f.vocab);
      std::vector<int32_t> out;
      out.reserve(32);
      run.gen->generate(f.prompt, 32, sampler, std::nullopt, out);  // warm: oneDNN's first calls
      test::alloc_counter_start();
      const auto r = run.gen->generate(f.prompt, 32, sampler, std::nullopt, out);
      const test::AllocCounts counts = test::alloc_counter_stop();
      EXPECT_EQ(counts.memfit_allocations, 0);
      EXPECT_EQ(counts.library_bytes_outstanding, 0);
      EXPECT_EQ(r.new_tokens, 32);
      for (Tier t : kAllTiers)
        EXPECT_EQ(run.ex->buffer(t).measured_high_water(), run.compiled.plan.tier(t).peak_bytes) << tier_name(t);
      // The caches are planned as their own category, kv heads only: 2 x layers x KV x S x HS.
      const int64_t kv = run.spec.n_kv_head > 0 ? run.spec.n_kv_head : run.spec.n_head;
      const uint64_t cache = 2 * run.spec.n_layer * kv * (P + 31) * run.spec.head_dim() *
                             (precision == Precision::fp32 ? 4 : 2);
      EXPECT_EQ(run.compiled.plan.tier(Tier::device).at_peak[size_t(Category::kv_cache)], cache);
    }
  }
}

TEST(Generate, OnlyTheLastPositionsLogitsAreComputed) {
  const Fixture f = read_fixture("gpt2_tiny");
  GenRun run("gpt2_tiny", 8, 40);
  const Program& p = run.compiled.program;
  for (const Op& op : p.ops())
    if (op.name.ends_with("lm_head")) {
      EXPECT_EQ(std::get<MatmulAttrs>(op.attrs).m, 1) << op.name;
    }
}

TEST(Generate, SamplingIsReproducibleFromTheSeed) {
  const Fixture f = read_fixture("llama_tiny");
  GenRun run("llama_tiny", 8, 8 + 31);
  auto sample = [&](uint64_t seed, int64_t top_k, double temperature) {
    SamplingOptions o;
    o.temperature = temperature, o.top_k = top_k, o.seed = seed;
    Sampler s(o, f.vocab);
    std::vector<int32_t> out;
    out.reserve(32);
    run.gen->generate(f.prompt, 32, s, std::nullopt, out);
    return out;
  };
  EXPECT_EQ(sample(5, 0, 1.0), sample(5, 0, 1.0));
  EXPECT_NE(sample(5, 0, 1.0), sample(6, 0, 1.0));
  EXPECT_EQ(sample(5, 1, 1.0), f.tokens);  // top-k 1 is greedy
  EXPECT_EQ(sample(9, 1, 3.0), f.tokens);
}

TEST(Generate, StopsAtEos) {
  const Fixture f = read_fixture("llama_tiny");
  GenRun run("llama_tiny", 8, 8 + 31);
  Sampler greedy(SamplingOptions{}, f.vocab);
  std::vector<int32_t> out;
  out.reserve(32);
  const auto r = run.gen->generate(f.prompt, 32, greedy, f.tokens[4], out);
  EXPECT_TRUE(r.stopped_at_eos);
  EXPECT_EQ(out, std::vector<int32_t>(f.tokens.begin(), f.tokens.begin() + 5));
}

void expect_one_line_error(const std::function<void()>& fn, const std::string& words) {
  try {
    fn();
    ADD_FAILURE() << "no error; expected one naming: " << words;
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_EQ(what.find('\n'), std::string::npos) << what;
    EXPECT_NE(what.find(words), std::string::npos) << what;
  }
}

TEST(Generate, BadInputIsOneLine) {
  RunConfig c;
  c.model = model_dir("gpt2_tiny");
  c.load = model_dir("gpt2_tiny");
  std::ostringstream log;
  GenerateRequest r;
  r.prompt_ids = std::vector<int32_t>(60, 1);
  r.max_new_tokens = 10;
  expect_one_line_error([&] { run_generate(c, r, log); }, "exceeds the 64 positions");
  r.prompt_ids = {1, 2, 250};
  expect_one_line_error([&] { run_generate(c, r, log); }, "token id 250 is outside the vocabulary");
  r.prompt_ids = {1, 2, 3};
  for (double p : {0.0, 1.5, -0.1}) {
    r.sampling.top_p = p;
    expect_one_line_error([&] { run_generate(c, r, log); }, "--top-p must be in (0, 1]");
  }
  r.sampling.top_p = 1.0;
  r.prompt_ids.clear();
  r.prompt = "hello";
  expect_one_line_error([&] { run_generate(c, r, log); }, "needs --tokenizer");
}

TEST(Generate, RunReportsPlannedEqualsMeasured) {
  RunConfig c;
  c.model = model_dir("llama_tiny");
  c.load = model_dir("llama_tiny");
  const Fixture f = read_fixture("llama_tiny");
  GenerateRequest r;
  r.prompt_ids = f.prompt;
  std::ostringstream log;
  const nlohmann::json report = run_generate(c, r, log);
  EXPECT_EQ(report["tokens"].get<std::vector<int32_t>>(), f.tokens);
  EXPECT_TRUE(report["memory"]["planned_equals_measured"].get<bool>());
  EXPECT_NE(log.str().find("kv_cache"), std::string::npos) << log.str();
}

}  // namespace
}  // namespace memfit

namespace memfit {
namespace {

RunConfig sampling_run(const std::string& name) {
  RunConfig c;
  c.model = model_dir(name);
  c.load = model_dir(name);
  c.policy.batch = 2;
  c.policy.seq = 16;
  c.steps = 3;
  c.lr = 0;  // the weights stay the fixture's, so the samples can be checked against memfit generate
  c.val_fraction = 0;
  c.sample_every = 2;
  c.sample_tokens = 12;
  return c;
}

TEST(SampleEvery, TrainingSamplesEqualGenerateOnTheSameWeightsAndArePlanned) {
  for (const std::string name : {"gpt2_tiny", "llama_tiny"}) {
    SCOPED_TRACE(name);
    const RunConfig c = sampling_run(name);
    std::ostringstream log;
    const nlohmann::json report = run_training(c, log);
    GenerateRequest r;
    r.prompt_ids = {0};
    r.max_new_tokens = c.sample_tokens;
    RunConfig g;
    g.model = g.load = model_dir(name);
    std::ostringstream glog;
    const auto tokens = run_generate(g, r, glog)["tokens"].get<std::vector<int32_t>>();
    const std::string line = fmt::format("sample: ids {}\n", fmt::join(tokens, ","));
    // Steps 2 and 3 (the last) sample; step 1 does not.
    EXPECT_NE(log.str().find("step     2/3 | " + line), std::string::npos) << log.str();
    EXPECT_NE(log.str().find("step     3/3 | " + line), std::string::npos) << log.str();
    EXPECT_EQ(log.str().find("step     1/3 | sample"), std::string::npos) << log.str();
    // The samples' cache is in the run's one plan, which the run measured.
    EXPECT_GT(report["memory"]["tiers"]["device"]["by_category"]["kv_cache"].get<uint64_t>(), 0u) << report["memory"].dump();
    EXPECT_EQ(report["memory"]["planned_peak_bytes"]["device"], report["memory"]["measured_peak_bytes"]["device"]);
  }
}

TEST(SampleEvery, RefusesWhatItCannotReadWholeWeightsFrom) {
  std::ostringstream log;
  RunConfig c = sampling_run("gpt2_tiny");
  c.policy.zero_stage = 3;
  expect_one_line_error([&] { run_training(c, log); }, "ZeRO stage 3");
  c = sampling_run("gpt2_tiny");
  c.load.clear();
  c.policy.lora.rank = 4;
  expect_one_line_error([&] { run_training(c, log); }, "LoRA");
  c = sampling_run("gpt2_tiny");
  c.sample_tokens = 65;  // one prompt token + 65 - 1 cache positions: one past the 64
  expect_one_line_error([&] { run_training(c, log); }, "exceeds the 64 positions");
}

}  // namespace
}  // namespace memfit

namespace memfit {
namespace {

// Draw counts per token over `draws` samples.
std::vector<int> histogram(const SamplingOptions& o, const std::vector<float>& logits, int draws) {
  Sampler s(o, int64_t(logits.size()));
  std::vector<int> n(logits.size());
  for (int i = 0; i < draws; ++i) ++n[size_t(s.next(logits))];
  return n;
}

TEST(Sampling, GreedyTakesTheLowestIndexOnTies) {
  EXPECT_EQ(greedy_token(std::vector<float>{1, 3, 3, 2}), 1);
  Sampler s(SamplingOptions{}, 4);
  EXPECT_EQ(s.next(std::vector<float>{0, -1, 7, 7}), 2);
}

TEST(Sampling, TopKKeepsTiesAtTheKthLogitAsTransformersDoes) {
  SamplingOptions o;
  o.temperature = 1, o.top_k = 2, o.seed = 1;
  const std::vector<int> n = histogram(o, {5, 4, 4, 1}, 3000);
  EXPECT_GT(n[0], 0);
  EXPECT_GT(n[1], 0);
  EXPECT_GT(n[2], 0);
  EXPECT_EQ(n[3], 0);
}

TEST(Sampling, TopPDropsTheAscendingTailAndRenormalises) {
  // Probabilities 0.5, 0.3, 0.15, 0.05: ascending cumulative 0.05, 0.2, 0.5, 1.
  const std::vector<float> logits = {std::log(0.5f), std::log(0.3f), std::log(0.15f), std::log(0.05f)};
  SamplingOptions o;
  o.temperature = 1, o.seed = 2;
  o.top_p = 0.75;  // drops cumulative <= 0.25: the 0.05 and the 0.15
  std::vector<int> n = histogram(o, logits, 4000);
  EXPECT_EQ(n[2] + n[3], 0);
  EXPECT_NEAR(double(n[0]) / 4000, 0.5 / 0.8, 0.03);
  o.top_p = 0.9;  // drops cumulative <= 0.1: the 0.05 only
  n = histogram(o, logits, 4000);
  EXPECT_EQ(n[3], 0);
  EXPECT_GT(n[2], 0);
  o.top_p = 0.01;  // the most probable token is always kept
  n = histogram(o, logits, 100);
  EXPECT_EQ(n[0], 100);
}

TEST(Sampling, TemperatureSharpensTowardsTheTopToken) {
  SamplingOptions o;
  o.seed = 4;
  const std::vector<float> logits = {1.0f, 0.5f, 0.0f};
  o.temperature = 1;
  const int warm = histogram(o, logits, 4000)[0];
  o.temperature = 0.1;
  const int cold = histogram(o, logits, 4000)[0];
  EXPECT_NEAR(double(warm) / 4000, std::exp(1.0) / (std::exp(1.0) + std::exp(0.5) + 1.0), 0.03);
  EXPECT_GT(cold, 3900);
}

}  // namespace
}  // namespace memfit

namespace memfit {
namespace {

TEST(Generate, TheRunStopsAtTheConfigsEosUnlessIgnored) {
  const Fixture f = read_fixture("llama_tiny");
  nlohmann::json config = nlohmann::json::parse(std::ifstream(model_dir("llama_tiny") + "/config.json"));
  config["eos_token_id"] = f.tokens[4];
  const std::string dir = test::temp_dir();
  test::write_file(dir + "/config.json", config.dump());
  RunConfig c;
  c.model = dir + "/config.json";
  c.load = model_dir("llama_tiny");
  GenerateRequest r;
  r.prompt_ids = f.prompt;
  std::ostringstream log;
  nlohmann::json report = run_generate(c, r, log);
  EXPECT_TRUE(report["stopped_at_eos"].get<bool>());
  EXPECT_EQ(report["tokens"].get<std::vector<int32_t>>(), std::vector<int32_t>(f.tokens.begin(), f.tokens.begin() + 5));
  r.ignore_eos = true;
  report = run_generate(c, r, log);
  EXPECT_EQ(report["tokens"].get<std::vector<int32_t>>(), f.tokens);
}

}  // namespace
}  // namespace memfit
