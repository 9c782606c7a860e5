// QLoRA against transformers + bitsandbytes + PEFT on the committed fixture
// (tools/make_qlora_fixtures.py): llama_tiny_torch's fp32 HF base loaded as --load does with
// --quantize-base nf4 --double-quant, lora_llama_tiny_torch's adapter as --load-adapter does, in
// bf16 and in fp32 compute. Then
// - every quantised weight's codes, absmax codes, second-level absmax and offset equal those
//   bnb made when transformers loaded the same file (bit for bit), and memfit quantises exactly
//   the weights bnb does;
// - the first step's loss is within 1e-3 relative of PEFT's (bf16), 1e-5 (fp32), and so is the
//   loss with lora_llama_dora_tiny_torch's DoRA adapter (QDoRA);
// - the step allocates nothing and its plan equals the measured high-water mark;
// - through the CLI, the same run resumes from a checkpoint bit for bit.
// Weights larger than one staging chunk (sharded files, GPT-2's transposed Conv1D) load into
// the codes that quantising each whole HF tensor at once gives.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <regex>
#include <set>
#include <sstream>

#include <unistd.h>

#include <fmt/format.h>

#include "graph/precision.hpp"
#include "graph/quant_layout.hpp"
#include "graph/quantize_base.hpp"
#include "graph/training_program.hpp"
#include "io/hf_config.hpp"
#include "io/safetensors.hpp"
#include "kernels/backend.hpp"
#include "kernels/quant/blockwise.hpp"
#include "kernels/quant/quant_segments.hpp"
#include "support/alloc_counter.hpp"
#include "support/adapter_run.hpp"
#include "support/paths.hpp"
#include "support/run_cli.hpp"
#include "support/tensor_values.hpp"
#include "train/adapter_files.hpp"
#include "train/init.hpp"
#include "train/master_weights.hpp"
#include "train/quantized_weights.hpp"
#include "train/weights.hpp"

namespace memfit {
namespace {

namespace fs = std::filesystem;

const std::string kBase = test::fixture_path("llama_tiny_torch");
const std::string kAdapter = test::fixture_path("lora_llama_tiny_torch");
const std::string kExpected = test::fixture_path("qlora_llama_tiny_torch") + "/expected.safetensors";
const std::string kDoraAdapter = test::fixture_path("lora_llama_dora_tiny_torch");

// A QLoRA run of the fixture's base and adapter.
struct QloraRun : test::AdapterRun {
  explicit QloraRun(Precision precision, const std::string& adapter = kAdapter)
      : AdapterRun(kBase, adapter, policy(precision)) {}
  static Policy policy(Precision precision) {
    Policy pol;
    pol.precision = precision;
    pol.attention = AttentionKind::flash;  // bf16 GQA has no plain-attention kernel
    pol.quantize_base = BaseQuantPolicy{BaseQuant::nf4, 64, true};
    return pol;
  }
};

// Bytes of fixture tensor `name` (any dtype).
std::vector<std::byte> fixture_bytes(const SafetensorsReader& r, const std::string& name) {
  const SafetensorsEntry* e = r.find(name);
  EXPECT_NE(e, nullptr) << name;
  if (!e) return {};
  return {r.data(*e), r.data(*e) + e->end - e->begin};
}

// bytes [at, at + n) of a storage tensor.
std::vector<std::byte> slice(const std::vector<std::byte>& all, uint64_t at, uint64_t n) {
  EXPECT_LE(at + n, all.size());
  if (at + n > all.size()) return {};
  return {all.begin() + int64_t(at), all.begin() + int64_t(at + n)};
}

struct Variant {
  const char* key;  // the fixture's prefix
  Precision precision;
  double loss_tolerance;  // relative
};

class QloraParity : public ::testing::TestWithParam<Variant> {};

// The run's second micro-step (the first warms its kernels up) allocates nothing, its plan
// equals the measured high-water mark, and its loss is the fixture's `<dtype>.<what>`.
void expect_first_loss(QloraRun& run, const SafetensorsReader& expected, const Variant& v, const std::string& what) {
  float ref = 0;
  expected.read_f32(std::string(v.key) + "." + what, Shape{}, &ref);
  run.micro_step();
  test::alloc_counter_start();
  const float loss = run.micro_step();
  EXPECT_EQ(test::alloc_counter_stop().memfit_allocations, 0);
  EXPECT_EQ(run.compiled.plan.tier(Tier::device).peak_bytes, run.ex->arena(Tier::device).measured_high_water());
  EXPECT_NEAR(loss, ref, v.loss_tolerance * std::fabs(ref));
  std::printf("%s %s: memfit %.7f, peft + bnb %.7f (relative %.3g)\n", v.key, what.c_str(), loss, ref,
              std::fabs(loss - ref) / std::fabs(ref));
}

TEST_P(QloraParity, CodesEqualBitsandbytesAndFirstLossMatchesPeft) {
  const Variant v = GetParam();
  const SafetensorsReader expected(kExpected);
  QloraRun run(v.precision);
  const Program& p = run.compiled.program;
  std::set<std::string> bnb_names, ours;
  std::stringstream list(expected.metadata().at("quantised"));
  for (std::string name; std::getline(list, name, ',');) bnb_names.insert(name);
  for (const ParamEntry& e : p.params()) {
    if (!is_quantized_param(e)) continue;
    const QuantizedParam qp = quantized_param_of(p, e);
    EXPECT_EQ(qp.weight_dtype, compute_dtype(v.precision));
    const QuantSpec& qs = qp.spec;
    const std::vector<std::byte> codes = test::tensor_bytes(*run.ex, qp.codes),
                                 scales = test::tensor_bytes(*run.ex, qp.scales),
                                 scales2 = test::tensor_bytes(*run.ex, qp.scales2),
                                 offset = test::tensor_bytes(*run.ex, qp.offset);
    const std::vector<HfPiece> pieces = hf_pieces(run.spec, e.name, Shape{qp.rows, qp.cols});
    ASSERT_EQ(pieces.size(), qp.segments.size()) << e.name;
    uint64_t c = 0, a = 0, a2 = 0;
    for (size_t s = 0; s < pieces.size(); ++s) {
      const std::string& name = pieces[s].name;
      ours.insert(name);
      const QuantStorage q = quant_storage(qs, qp.segments[s] * qp.cols);
      const std::string prefix = std::string(v.key) + "." + name;
      EXPECT_EQ(slice(codes, c, q.codes), fixture_bytes(expected, prefix + ".codes")) << name;
      EXPECT_EQ(slice(scales, a, q.absmax), fixture_bytes(expected, prefix + ".absmax_codes")) << name;
      EXPECT_EQ(slice(scales2, a2, q.absmax2), fixture_bytes(expected, prefix + ".absmax2")) << name;
      EXPECT_EQ(slice(offset, s * sizeof(float), sizeof(float)), fixture_bytes(expected, prefix + ".offset")) << name;
      c += q.codes, a += q.absmax, a2 += q.absmax2;
    }
    EXPECT_EQ(c, codes.size()) << e.name;
  }
  EXPECT_EQ(ours, bnb_names);
  EXPECT_EQ(bnb_names.size(), 14u);  // 2 layers x q, k, v, o, gate, up, down

  expect_first_loss(run, expected, v, "loss");
}

// QDoRA: the DoRA adapter (use_dora; its magnitudes from the file) on the same quantised base.
// DoRA's norm dequantises W's rows as the quantised product does.
TEST_P(QloraParity, DoraOnTheQuantisedBaseMatchesPeft) {
  const Variant v = GetParam();
  const SafetensorsReader expected(kExpected);
  QloraRun run(v.precision, kDoraAdapter);
  ASSERT_TRUE(run.lora.dora);
  int norms = 0;
  for (const Op& op : run.compiled.program.ops())
    norms += op.kind == OpKind::dora_norm && std::get<DoraNormAttrs>(op.attrs).quantized;
  EXPECT_EQ(norms, 8);  // 2 layers x q, v, o, down
  expect_first_loss(run, expected, v, "dora_loss");
}

INSTANTIATE_TEST_SUITE_P(Fixture, QloraParity,
                         ::testing::Values(Variant{"bf16", Precision::bf16, 1e-3}, Variant{"fp16", Precision::fp16, 1e-5},
                                           Variant{"fp32", Precision::fp32, 1e-5}),
                         [](const auto& info) { return std::string(info.param.key); });

std::string last_step_line(const std::string& out) {
  static const std::regex line("step +[0-9]+/[0-9]+ \\| loss [0-9.]+");
  std::string last;
  for (auto it = std::sregex_iterator(out.begin(), out.end(), line); it != std::sregex_iterator(); ++it) last = it->str();
  return last;
}

// The CLI run: --load quantises the base, the plan equals the measurement, and two steps then a
// resume from their checkpoint end where four straight steps end (the codes are in the
// checkpoint; --load's quantisation is not repeated over them).
TEST(QloraCli, LoadQuantisesAndACheckpointResumesBitForBit) {
  const fs::path dir = fs::path(test::temp_dir()) / "qlora_resume";
  fs::remove_all(dir);
  const std::string model = "train --model " + kBase + "/config.json --load-adapter " + kAdapter;
  const std::string run = model + " --load " + kBase + " --quantize-base nf4 --double-quant --precision bf16 --attention flash --batch 2 --seq 32 "
                          "--lr 1e-3 --val-fraction 0";
  const test::CliResult full = test::run_memfit(run + " --steps 4");
  ASSERT_EQ(full.status, 0) << full.err;
  EXPECT_NE(full.out.find("loaded weights from " + kBase), std::string::npos) << full.out;
  EXPECT_NE(full.out.find(", equal;"), std::string::npos) << full.out;
  const test::CliResult first =
      test::run_memfit(run + " --steps 2 --checkpoint-dir " + dir.string() + " --checkpoint-every 2");
  ASSERT_EQ(first.status, 0) << first.err;
  // --resume gives the weights (the codes among them): --load goes.
  std::string resume = run;
  resume.replace(0, (model + " --load " + kBase).size(), model);
  const test::CliResult resumed = test::run_memfit(resume + " --steps 4 --resume " + dir.string());
  ASSERT_EQ(resumed.status, 0) << resumed.err;
  EXPECT_FALSE(last_step_line(full.out).empty()) << full.out;
  EXPECT_EQ(last_step_line(resumed.out), last_step_line(full.out));
  EXPECT_NE(last_step_line(resumed.out), last_step_line(first.out));
  fs::remove_all(dir);
}

struct Built {
  Built(const ModelSpec& spec, const Policy& pol)
      : backend(make_cpu_backend()), compiled(compile_program(build_training_program(spec, pol, {}, cpu_capabilities()),
                                                              *backend)),
        ex(std::make_unique<Executor>(compiled, *backend)) {}
  std::unique_ptr<Backend> backend;
  CompiledProgram compiled;
  std::unique_ptr<Executor> ex;
};

// The stored bytes of a quantised parameter, every part concatenated.
std::vector<std::byte> stored(const Executor& ex, const QuantizedParam& qp) {
  std::vector<std::byte> all;
  for (TensorId id : {qp.codes, qp.scales, qp.scales2, qp.offset}) {
    if (id == kNoTensor) continue;
    const std::vector<std::byte> b = test::tensor_bytes(ex, id);
    all.insert(all.end(), b.begin(), b.end());
  }
  return all;
}

// The same parts from quantising the whole weight at once (values in memfit's row order).
std::vector<std::byte> quantised_whole(const QuantizedParam& qp, const std::vector<float>& values) {
  const QuantSpec& qs = qp.spec;
  const QuantStorage st = segmented_quant_storage(qs, qp.cols, qp.segments);
  std::vector<uint8_t> codes(st.codes), scales(st.absmax);
  std::vector<float> scales2(st.absmax2 / 4), offset(st.offset / 4), staging(size_t(max_segment_blocks(qs, qp.cols, qp.segments)));
  if (qp.weight_dtype == DType::bf16) {
    std::vector<bf16_t> r;
    for (float x : values) r.push_back(round_to_bf16(x));
    quantize_segments<bf16_t>(r, qs, qp.cols, qp.segments, codes, scales, scales2, offset, staging);
  } else {
    quantize_segments<float>(values, qs, qp.cols, qp.segments, codes, scales, scales2, offset, staging);
  }
  std::vector<std::byte> all;
  for (std::span<const std::byte> b : {std::as_bytes(std::span(codes)), std::as_bytes(std::span(scales)),
                                       std::as_bytes(std::span(scales2)), std::as_bytes(std::span(offset))})
    all.insert(all.end(), b.begin(), b.end());
  return all;
}

// One block of 384 wide layers: the MLP weights (and GPT-2's c_attn) span two to three staging
// chunks of 262144 elements, GPT-2's chunk boundaries fall inside rows of its transposed weights,
// and the file is sharded at 1 MiB.
TEST(QuantizedLoad, ChunkedShardedAndTransposedLoadsEqualEachWholeTensorQuantised) {
  struct Case {
    const char* model;
    std::vector<std::string> freeze;
    Precision precision;
    BaseQuant kind;
    bool double_quant;
  };
  for (const Case& k : {Case{"gpt2-tiny", {"h.*.attn.*", "h.*.mlp.*"}, Precision::fp32, BaseQuant::nf4, true},
                        Case{"gpt2-tiny", {"h.*.mlp.*"}, Precision::bf16, BaseQuant::int8, false},
                        Case{"llama-tiny", {"layers.*.self_attn.*", "layers.*.mlp.*"}, Precision::bf16, BaseQuant::fp4, false},
                        Case{"llama-tiny", {"layers.*.self_attn.*", "layers.*.mlp.*"}, Precision::bf16, BaseQuant::nf4, true}}) {
    SCOPED_TRACE(fmt::format("{} {}{}", k.model, base_quant_name(k.kind), k.double_quant ? "+dq" : ""));
    ModelSpec spec = model_preset(k.model);
    const bool gpt2 = spec.arch == Arch::gpt2;
    spec.n_layer = 1, spec.n_embd = 384, spec.n_head = 6, spec.n_kv_head = gpt2 ? 6 : 2, spec.n_inner = gpt2 ? 1536 : 1376;
    Policy pol;
    pol.batch = 1, pol.seq = 16, pol.with_eval = false, pol.precision = k.precision;
    pol.attention = AttentionKind::flash;
    Built plain(spec, pol);
    TensorStaging staging;
    initialize_parameters(*plain.ex, spec, 11, staging);
    const fs::path dir = fs::temp_directory_path() / ("memfit_qload_" + std::to_string(::getpid()));
    fs::remove_all(dir);
    save_weights(dir.string(), *plain.ex, spec, staging, nullptr, 1 << 20);
    ASSERT_TRUE(fs::exists(dir / "model.safetensors.index.json"));
    pol.freeze = k.freeze;
    pol.quantize_base = BaseQuantPolicy{k.kind, 64, k.double_quant};
    Built quant(spec, pol);
    load_weights(dir.string(), *quant.ex, spec, staging);
    fs::remove_all(dir);
    int checked = 0, chunked = 0;
    for (size_t i = 0; i < quant.compiled.program.params().size(); ++i) {
      const ParamEntry& e = quant.compiled.program.params()[i];
      if (!is_quantized_param(e)) continue;
      const QuantizedParam qp = quantized_param_of(quant.compiled.program, e);
      std::vector<float> values(size_t(qp.rows * qp.cols));
      for (size_t at = 0; at < values.size(); at += staging.values().size()) {
        const size_t n = std::min(staging.values().size(), values.size() - at);
        load_parameter_range(*plain.ex, plain.compiled.program.params()[i], int64_t(at), staging.values().first(n), staging);
        std::copy_n(staging.values().begin(), n, values.begin() + int64_t(at));
      }
      EXPECT_EQ(stored(*quant.ex, qp), quantised_whole(qp, values)) << e.name;
      ++checked;
      chunked += values.size() > TensorStaging::kElements;
    }
    EXPECT_GE(checked, gpt2 ? 2 : 4);
    EXPECT_GE(chunked, gpt2 ? 1 : 3);
  }
}

}  // namespace
}  // namespace memfit
