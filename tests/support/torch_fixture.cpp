#include "support/torch_fixture.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>

#include "io/hf_config.hpp"
#include "support/paths.hpp"
#include "support/tensor_values.hpp"
#include "train/init.hpp"
#include "train/weights.hpp"
#include "kernels/backend.hpp"

namespace memfit::test {
namespace {

void copy_i32(const SafetensorsReader& r, const std::string& name, int32_t* dst, int64_t n) {
  const SafetensorsEntry* e = r.find(name);
  ASSERT_TRUE(e && e->end - e->begin == uint64_t(n) * sizeof(int32_t)) << name;
  std::memcpy(dst, r.data(*e), size_t(n) * sizeof(int32_t));
}

// Writes int32 tensor `name` of the file (n values) into the executor's tensor `id`, straight
// from the file's mapping (no allocation: the input handler runs inside steps).
void write_i32(const SafetensorsReader& r, const std::string& name, Executor& ex, TensorId id, int64_t n) {
  const SafetensorsEntry* e = r.find(name);
  ASSERT_TRUE(e && e->end - e->begin == uint64_t(n) * sizeof(int32_t)) << name;
  ex.write(id, std::span<const std::byte>(r.data(*e), size_t(n) * sizeof(int32_t)));
}

}  // namespace

TorchFixtureRun::TorchFixtureRun(const std::string& fixture, AttentionKind attention, const std::string& weights)
    : dir(fixture_path(fixture)),
      spec(read_hf_config(dir + "/config.json")),
      backend(make_cpu_backend()),
      batch(dir + "/batch.safetensors"),
      expected(dir + "/expected.safetensors") {
  const SafetensorsEntry* tokens_entry = batch.find("tokens");
  if (!tokens_entry || tokens_entry->shape.rank() != 2) throw std::runtime_error(dir + ": batch has no [B, T] tokens");
  batch_shape = tokens_entry->shape;
  rows = batch_shape.numel();
  Policy pol;
  pol.batch = batch_shape[0];
  pol.seq = batch_shape[1];
  pol.with_eval = false;
  pol.attention = attention;
  pol.adamw = AdamWConfig{0.9f, 0.999f, 1e-8f, 0.1f};  // the fixtures' AdamW
  compiled = compile_program(build_training_program(spec, pol, {}, cpu_capabilities()), *backend);
  ex = std::make_unique<Executor>(compiled, *backend);
  TensorStaging staging;
  load_weights(weights.empty() ? dir + "/model.safetensors" : weights, *ex, spec, staging);
  zero_persistent_state(*ex, staging);
  const TensorId tokens = compiled.program.find_tensor(kTokens), targets = compiled.program.find_tensor(kTargets);
  ex->set_input_handler([this, tokens, targets](const Op&, const StepContext&) {
    write_i32(batch, "tokens", *ex, tokens, rows);
    write_i32(batch, "targets", *ex, targets, rows);
  });
}

void expect_loss_and_gradients_match(TorchFixtureRun& run) {
  const Program& p = run.compiled.program;
  const Section* micro = p.find_section(SectionKind::micro);
  int loss_op = -1;
  for (int i = micro->begin; i < micro->end; ++i)
    if (p.op(i).kind == OpKind::loss_mean) loss_op = i;
  ASSERT_GE(loss_op, 0);
  StepContext ctx;
  run.ex->run_ops(micro->begin, loss_op + 1, ctx);

  // Per-token cross-entropy from PyTorch's logits, in double.
  const int64_t V = run.spec.vocab_size, N = run.rows;
  std::vector<float> logits(size_t(N * V));
  run.expected.read_f32("logits", Shape{run.batch_shape[0], run.batch_shape[1], V}, logits.data());
  std::vector<int32_t> targets(static_cast<size_t>(N));
  copy_i32(run.batch, "targets", targets.data(), N);
  const std::vector<float> losses = tensor_values<float>(*run.ex, p.find_tensor("losses"));
  for (int64_t i = 0; i < N; ++i) {
    const float* row = logits.data() + i * V;
    double mx = row[0], sum = 0;
    for (int64_t j = 0; j < V; ++j) mx = std::max(mx, double(row[j]));
    for (int64_t j = 0; j < V; ++j) sum += std::exp(double(row[j]) - mx);
    const double ref = std::log(sum) + mx - double(row[targets[size_t(i)]]);
    EXPECT_NEAR(losses[size_t(i)], ref, 1e-5 * std::fabs(ref)) << "token " << i;
  }
  std::vector<float> ref_loss(1);
  run.expected.read_f32("loss", Shape{}, ref_loss.data());
  const float loss = run.ex->read_scalar<float>(p.find_tensor(kLoss));
  EXPECT_NEAR(loss, ref_loss[0], 1e-5 * std::fabs(ref_loss[0]));
  std::printf("loss: memfit %.7f, PyTorch %.7f\n", loss, ref_loss[0]);

  run.ex->run_ops(loss_op + 1, micro->end, ctx);
  const bool gpt2 = run.spec.arch == Arch::gpt2;
  double worst = 0;
  std::string worst_name;
  int compared = 0;
  for (const ParamEntry& e : p.params()) {
    const TensorDesc& t = p.tensor(e.value);
    const int64_t row_size = t.numel() / t.shape[0];
    const std::vector<float> ours = tensor_values<float>(*run.ex, e.grad);
    int64_t row = 0;
    for (const HfPiece& piece : hf_pieces(run.spec, e.name, t.shape)) {
      const bool transpose = gpt2 && is_conv1d_weight(e.name);
      Shape shape = t.shape.rank() == 1 ? Shape{piece.rows} : Shape{piece.rows, row_size};
      if (transpose) shape = Shape{t.shape[1], t.shape[0]};
      std::vector<float> ref(size_t(shape.numel()));
      run.expected.read_f32("grad." + std::string(gpt2 ? "transformer." : "") + piece.name, shape, ref.data(),
                            transpose);
      double err = 0, scale = 0;
      for (size_t i = 0; i < ref.size(); ++i) {
        err = std::max(err, double(std::fabs(ours[size_t(row * row_size) + i] - ref[i])));
        scale = std::max(scale, double(std::fabs(ref[i])));
      }
      EXPECT_GT(scale, 0) << piece.name;
      EXPECT_LE(err, 1e-4 * scale) << piece.name << " max abs error " << err << " of max " << scale;
      if (err / scale > worst) worst = err / scale, worst_name = piece.name;
      row += piece.rows;
      ++compared;
    }
    for (int64_t i = row * row_size; i < t.numel(); ++i)  // padded vocabulary rows get no gradient
      ASSERT_EQ(ours[size_t(i)], 0.0f) << e.name << " padded element " << i;
  }
  const auto grads = std::count_if(run.expected.entries().begin(), run.expected.entries().end(),
                                   [](const SafetensorsEntry& e) { return e.name.starts_with("grad."); });
  EXPECT_EQ(compared, int(grads));  // every grad.* of the fixture
  EXPECT_GT(compared, 0);
  std::printf("largest normalised gradient error: %.3g (%s)\n", worst, worst_name.c_str());
}

void expect_adamw_losses_match(TorchFixtureRun& run) {
  std::vector<float> ref(4);
  run.expected.read_f32("losses_adamw", Shape{4}, ref.data());
  const TensorId loss_id = run.compiled.program.find_tensor(kLoss);
  const auto loss = [&] { return run.ex->read_scalar<float>(loss_id); };
  StepContext ctx;
  ctx.lr = 1e-3f;
  for (int step = 1; step <= 3; ++step) {
    ctx.step = step;
    run.ex->run_step(ctx);
    EXPECT_NEAR(loss(), ref[size_t(step - 1)], 1e-4 * ref[size_t(step - 1)]) << "before update " << step;
  }
  run.ex->run_section(SectionKind::micro, ctx);
  EXPECT_NEAR(loss(), ref[3], 1e-4 * ref[3]) << "after three updates";
  std::printf("after 3 updates: memfit %.7f, PyTorch %.7f\n", loss(), ref[3]);
}

}  // namespace memfit::test
