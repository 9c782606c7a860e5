// memfit against PyTorch + HF transformers on the committed fixture (tools/make_gpt2_fixtures.py):
// a 2-layer GPT-2 with a 250-token vocabulary (padded to 256 rows by memfit), one batch of
// 2 x 32. Per-token losses and the mean loss to 1e-5 relative, every parameter gradient to
// 1e-4 (max |a - b| / max |b|), and the loss trajectory over three AdamW steps to 1e-4.
#include <gtest/gtest.h>

#include <cmath>

#include "graph/training_program.hpp"
#include "io/hf_config.hpp"
#include "io/safetensors.hpp"
#include "runtime/executor.hpp"
#include "support/paths.hpp"
#include "train/init.hpp"
#include "train/weights.hpp"

namespace memfit {
namespace {

const std::string kDir = test::fixture_path("gpt2_tiny_torch");

struct ParityRun {
  ModelSpec spec = read_hf_config(kDir + "/config.json");
  std::unique_ptr<Backend> backend = make_cpu_backend();
  CompiledProgram compiled;
  std::unique_ptr<Executor> ex;
  SafetensorsReader batch{kDir + "/batch.safetensors"};
  ParityRun() {
    Policy pol;
    pol.batch = 2;
    pol.seq = 32;
    pol.with_eval = false;
    pol.adamw = AdamWConfig{0.9f, 0.999f, 1e-8f, 0.1f};
    compiled = compile_program(build_training_program(spec, pol, {}), *backend);
    ex = std::make_unique<Executor>(compiled, *backend);
    load_weights(kDir + "/model.safetensors", *ex, spec);
    zero_persistent_state(*ex);
    const TensorId tokens = compiled.program.find_tensor(kTokens), targets = compiled.program.find_tensor(kTargets);
    ex->set_input_handler([this, tokens, targets](const Op&, const StepContext&) {
      copy_i32("tokens", ex->data_as<int32_t>(tokens));
      copy_i32("targets", ex->data_as<int32_t>(targets));
    });
  }
  void copy_i32(const std::string& name, int32_t* dst) const {
    const SafetensorsEntry* e = batch.find(name);
    ASSERT_NE(e, nullptr);
    std::memcpy(dst, batch.data(*e), e->end - e->begin);
  }
};

double max_abs(const std::vector<float>& v) {
  double m = 0;
  for (float x : v) m = std::max(m, double(std::fabs(x)));
  return m;
}

TEST(PyTorchParity, LossesAndEveryGradientMatch) {
  ParityRun run;
  const SafetensorsReader expected(kDir + "/expected.safetensors");
  const Program& p = run.compiled.program;
  const Section* micro = p.find_section("micro");
  int loss_op = -1;
  for (int i = micro->begin; i < micro->end; ++i)
    if (p.op(i).kind == OpKind::loss_mean) loss_op = i;
  ASSERT_GE(loss_op, 0);
  StepContext ctx;
  run.ex->run_ops(micro->begin, loss_op + 1, ctx);

  // Per-token cross-entropy from PyTorch's logits, in double.
  const SafetensorsEntry* le = expected.find("logits");
  ASSERT_NE(le, nullptr);
  const int64_t V = run.spec.vocab_size, N = 2 * 32;
  std::vector<float> logits(size_t(N * V));
  expected.read_f32("logits", Shape{2, 32, V}, logits.data());
  std::vector<int32_t> targets(static_cast<size_t>(N));
  run.copy_i32("targets", targets.data());
  const float* losses = run.ex->data_as<float>(p.find_tensor("losses"));
  for (int64_t i = 0; i < N; ++i) {
    const float* row = logits.data() + i * V;
    double mx = row[0], sum = 0;
    for (int64_t j = 0; j < V; ++j) mx = std::max(mx, double(row[j]));
    for (int64_t j = 0; j < V; ++j) sum += std::exp(double(row[j]) - mx);
    const double ref = std::log(sum) + mx - double(row[targets[size_t(i)]]);
    EXPECT_NEAR(losses[i], ref, 1e-5 * std::fabs(ref)) << "token " << i;
  }
  std::vector<float> ref_loss(1);
  expected.read_f32("loss", Shape{}, ref_loss.data());
  const float loss = *run.ex->data_as<float>(p.find_tensor(kLoss));
  EXPECT_NEAR(loss, ref_loss[0], 1e-5 * std::fabs(ref_loss[0]));
  std::printf("loss: memfit %.7f, PyTorch %.7f\n", loss, ref_loss[0]);

  run.ex->run_ops(loss_op + 1, micro->end, ctx);
  double worst = 0;
  std::string worst_name;
  for (const ParamEntry& e : p.params()) {
    const TensorDesc& t = p.tensor(e.value);
    const bool transpose = is_conv1d_weight(e.name);
    Shape file_shape = transpose ? Shape{t.shape[1], t.shape[0]} : t.shape;
    int64_t rows_compared = t.shape.rank() == 2 ? t.shape[0] : 1;
    if (e.name == "wte.weight") file_shape = Shape{V, run.spec.n_embd}, rows_compared = V;
    std::vector<float> ref(size_t(file_shape.numel()));
    expected.read_f32("grad.transformer." + e.name, file_shape, ref.data(), transpose);
    const float* ours = run.ex->data_as<float>(e.grad);
    double err = 0;
    for (size_t i = 0; i < ref.size(); ++i) err = std::max(err, double(std::fabs(ours[i] - ref[i])));
    const double scale = max_abs(ref);
    EXPECT_LE(err, 1e-4 * scale) << e.name << " max abs error " << err << " of max " << scale;
    if (err / scale > worst) worst = err / scale, worst_name = e.name;
    if (e.name == "wte.weight") {
      // Padded rows get exactly zero gradient.
      for (int64_t i = V * run.spec.n_embd; i < t.numel(); ++i) ASSERT_EQ(ours[i], 0.0f) << "padded row element " << i;
    }
    (void)rows_compared;
  }
  std::printf("largest normalised gradient error: %.3g (%s)\n", worst, worst_name.c_str());
}

TEST(PyTorchParity, ThreeAdamWStepsFollowTheSameLosses) {
  ParityRun run;
  const SafetensorsReader expected(kDir + "/expected.safetensors");
  std::vector<float> ref(4);
  expected.read_f32("losses_adamw", Shape{4}, ref.data());
  const float* loss = run.ex->data_as<float>(run.compiled.program.find_tensor(kLoss));
  StepContext ctx;
  ctx.lr = 1e-3f;
  for (int step = 1; step <= 3; ++step) {
    ctx.step = step;
    run.ex->run_step(ctx);
    EXPECT_NEAR(*loss, ref[size_t(step - 1)], 1e-4 * ref[size_t(step - 1)]) << "before update " << step;
    std::printf("step %d loss: memfit %.7f, PyTorch %.7f\n", step, *loss, ref[size_t(step - 1)]);
  }
  run.ex->run_section("micro", ctx);
  EXPECT_NEAR(*loss, ref[3], 1e-4 * ref[3]) << "after three updates";
  std::printf("after 3 updates: memfit %.7f, PyTorch %.7f\n", *loss, ref[3]);
}

}  // namespace
}  // namespace memfit
