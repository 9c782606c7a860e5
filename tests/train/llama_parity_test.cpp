// memfit's llama against PyTorch + HF transformers on the committed fixture
// (tools/make_llama_fixtures.py): a 2-layer LlamaForCausalLM with grouped-query attention (4
// query heads, 2 key/value heads), RMSNorm, rotary embeddings, SwiGLU, an untied lm_head and a
// 250-token vocabulary (padded to 256 rows by memfit), on one batch of 2 x 32. The same
// tolerances as the GPT-2 parity test: per-token and mean loss to 1e-5 relative, every
// parameter gradient to 1e-4 of its largest element, three AdamW steps to 1e-4. Plain and
// flash attention both; the weights go through the HF llama loader (q|k|v fused on load).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "graph/training_program.hpp"
#include "io/hf_config.hpp"
#include "io/safetensors.hpp"
#include "runtime/executor.hpp"
#include "support/paths.hpp"
#include "train/init.hpp"
#include "train/weights.hpp"

namespace memfit {
namespace {

const std::string kDir = test::fixture_path("llama_tiny_torch");

struct LlamaRun {
  ModelSpec spec = read_hf_config(kDir + "/config.json");
  std::unique_ptr<Backend> backend = make_cpu_backend();
  CompiledProgram compiled;
  std::unique_ptr<Executor> ex;
  SafetensorsReader batch{kDir + "/batch.safetensors"};
  explicit LlamaRun(AttentionKind attention) {
    Policy pol;
    pol.batch = 2;
    pol.seq = 32;
    pol.with_eval = false;
    pol.attention = attention;
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

class LlamaParity : public ::testing::TestWithParam<AttentionKind> {};

TEST_P(LlamaParity, LossesAndEveryGradientMatch) {
  LlamaRun run(GetParam());
  ASSERT_EQ(run.spec.arch, Arch::llama);
  ASSERT_LT(run.spec.n_kv_head, run.spec.n_head);  // the fixture exercises grouped-query attention
  const SafetensorsReader expected(kDir + "/expected.safetensors");
  const Program& p = run.compiled.program;
  const Section* micro = p.find_section("micro");
  int loss_op = -1;
  for (int i = micro->begin; i < micro->end; ++i)
    if (p.op(i).kind == OpKind::loss_mean) loss_op = i;
  ASSERT_GE(loss_op, 0);
  StepContext ctx;
  run.ex->run_ops(micro->begin, loss_op + 1, ctx);

  const int64_t V = run.spec.vocab_size, N = 2 * 32;
  std::vector<float> logits(size_t(N * V));
  expected.read_f32("logits", Shape{2, 32, V}, logits.data());
  std::vector<int32_t> targets(static_cast<size_t>(N));
  run.copy_i32("targets", targets.data());
  const float* losses = run.ex->data_as<float>(p.find_tensor("losses"));
  for (int64_t i = 0; i < N; ++i) {  // per-token cross-entropy from PyTorch's logits, in double
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

  run.ex->run_ops(loss_op + 1, micro->end, ctx);
  int compared = 0;
  for (const ParamEntry& e : p.params()) {
    const TensorDesc& t = p.tensor(e.value);
    const int64_t row_size = t.numel() / t.shape[0];
    const float* ours = run.ex->data_as<float>(e.grad);
    int64_t row = 0;
    for (const HfPiece& piece : hf_pieces(run.spec, e.name, t.shape)) {
      const Shape shape = t.shape.rank() == 1 ? Shape{piece.rows} : Shape{piece.rows, row_size};
      std::vector<float> ref(size_t(shape.numel()));
      expected.read_f32("grad." + piece.name, shape, ref.data());
      double err = 0, scale = 0;
      for (size_t i = 0; i < ref.size(); ++i) {
        err = std::max(err, double(std::fabs(ours[row * row_size + int64_t(i)] - ref[i])));
        scale = std::max(scale, double(std::fabs(ref[i])));
      }
      EXPECT_GT(scale, 0) << piece.name;
      EXPECT_LE(err, 1e-4 * scale) << piece.name << " max abs error " << err << " of max " << scale;
      row += piece.rows;
      ++compared;
    }
    for (int64_t i = row * row_size; i < t.numel(); ++i)  // padded vocabulary rows get no gradient
      ASSERT_EQ(ours[i], 0.0f) << e.name << " padded element " << i;
  }
  EXPECT_EQ(compared, int(expected.entries().size()) - 3);  // every grad.* (not logits, loss, losses_adamw)
}

TEST_P(LlamaParity, ThreeAdamWStepsFollowTheSameLosses) {
  LlamaRun run(GetParam());
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
  }
  run.ex->run_section("micro", ctx);
  EXPECT_NEAR(*loss, ref[3], 1e-4 * ref[3]) << "after three updates";
}

INSTANTIATE_TEST_SUITE_P(Attention, LlamaParity, ::testing::Values(AttentionKind::naive, AttentionKind::flash),
                         [](const auto& info) { return info.param == AttentionKind::flash ? "flash" : "plain"; });

}  // namespace
}  // namespace memfit
