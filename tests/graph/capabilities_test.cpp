// The precision pass asks the capabilities of the backend that will run the program
// (graph/capabilities.hpp) which ops need an fp32 island: the same fp16 policy gives the CPU
// backend (oneDNN 2.6: no fp16 products) islands around every matmul, attention and
// classifier, gives a tensor-core GPU preset none, and is refused without capabilities.
#include <gtest/gtest.h>

#include <map>

#include "core/error.hpp"
#include "fit/hardware.hpp"
#include "graph/training_program.hpp"
#include "kernels/backend.hpp"

namespace memfit {
namespace {

Policy fp16_policy() {
  Policy p;
  p.batch = 2;
  p.seq = 32;
  p.precision = Precision::fp16;
  return p;
}

// Kinds whose ops sit inside an fp32 island (a cast_in op names them), counted per kind.
std::map<OpKind, int> islands(const Program& p) {
  std::map<std::string, OpKind> kind_of;
  for (const Op& op : p.ops()) kind_of[op.name] = op.kind;
  std::map<OpKind, int> out;
  for (const Op& op : p.ops()) {
    if (op.kind != OpKind::cast) continue;
    const size_t at = op.name.find(".cast_in0");
    if (at != std::string::npos && at + 9 == op.name.size()) ++out[kind_of.at(op.name.substr(0, at))];
  }
  return out;
}

TEST(Capabilities, TablesAnswerPerKindAndDtype) {
  const OpCapabilities& cpu = cpu_capabilities();
  EXPECT_TRUE(cpu.known());
  EXPECT_TRUE(cpu.supports(OpKind::matmul, DType::bf16));
  EXPECT_FALSE(cpu.supports(OpKind::matmul, DType::f16));
  EXPECT_TRUE(cpu.supports(OpKind::layernorm_forward, DType::f16));
  EXPECT_TRUE(make_cpu_backend()->supports(OpKind::matmul, DType::f32));
  const OpCapabilities h100 = hardware_preset("h100-80gb").capabilities;
  EXPECT_TRUE(h100.supports(OpKind::matmul, DType::f16));
  EXPECT_TRUE(h100.supports(OpKind::classifier, DType::bf16));
  EXPECT_FALSE(OpCapabilities{}.known());
  EXPECT_FALSE(hardware_preset("cpu").capabilities.known());  // the backend that runs here fills it in
}

TEST(Capabilities, Fp16ProductsAreIslandsOnTheCpuAndNativeOnATensorCoreGpu) {
  const ModelSpec spec = model_preset("gpt2-tiny");
  const std::map<OpKind, int> cpu = islands(build_training_program(spec, fp16_policy(), {}, cpu_capabilities()));
  for (OpKind k : {OpKind::matmul, OpKind::attention_forward, OpKind::attention_backward, OpKind::classifier,
                   OpKind::classifier_eval})
    EXPECT_GT(cpu.count(k), 0u) << op_kind_name(k);
  for (const auto& [kind, n] : cpu) EXPECT_FALSE(cpu_capabilities().supports(kind, DType::f16)) << op_kind_name(kind);
  const Program gpu = build_training_program(spec, fp16_policy(), {}, hardware_preset("h100-80gb").capabilities);
  EXPECT_TRUE(islands(gpu).empty());
  // bf16 products are native on both.
  Policy bf16 = fp16_policy();
  bf16.precision = Precision::bf16;
  EXPECT_TRUE(islands(build_training_program(spec, bf16, {}, cpu_capabilities())).empty());
}

TEST(Capabilities, A16BitProgramWithoutCapabilitiesIsRefused) {
  const ModelSpec spec = model_preset("gpt2-tiny");
  EXPECT_THROW(build_training_program(spec, fp16_policy(), {}, OpCapabilities{}), Error);
  Policy fp32 = fp16_policy();
  fp32.precision = Precision::fp32;  // fp32 programs have no islands to decide
  EXPECT_NO_THROW(build_training_program(spec, fp32, {}, OpCapabilities{}));
}

}  // namespace
}  // namespace memfit
