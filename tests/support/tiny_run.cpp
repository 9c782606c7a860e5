#include "support/tiny_run.hpp"

#include "graph/training_program.hpp"
#include "train/dora_init.hpp"
#include "train/init.hpp"
#include "kernels/backend.hpp"

namespace memfit::test {

CompiledProgram compile_tiny(const Policy& policy) {
  return compile_program(build_training_program(model_preset("gpt2-tiny"), policy, {}, cpu_capabilities()), *make_cpu_backend());
}

TinyRun::TinyRun(const Policy& policy, uint64_t seed) : TinyRun(compile_tiny(policy), seed) {}

TinyRun::TinyRun(CompiledProgram c, uint64_t seed, const ExecutorOptions& options, const std::string& model,
                 std::unique_ptr<Backend> be)
    : backend(be ? std::move(be) : make_cpu_backend()), compiled(std::move(c)) {
  ex = std::make_unique<Executor>(compiled, *backend, nullptr, options);
  initialize_parameters(*ex, model_preset(model), seed);
  TensorStaging staging;
  initialize_dora_magnitudes(*ex, staging);  // DoRA's magnitudes from the weights just drawn
  zero_persistent_state(*ex);
  const Program& p = compiled.program;
  const TensorId toks[] = {p.find_tensor(kTokens), p.find_tensor(kEvalTokens)};
  const TensorId tgts[] = {p.find_tensor(kTargets), p.find_tensor(kEvalTargets)};
  batch_tokens.assign(size_t(p.tensor(toks[0]).numel()), 0);  // eval batches have the same shape
  batch_targets.assign(batch_tokens.size(), 0);
  ex->set_input_handler([this, toks, tgts](const Op& op, const StepContext& ctx) {
    const int which = op.outputs[0] == toks[0] ? 0 : 1;
    for (size_t i = 0; i < batch_tokens.size(); ++i) {
      batch_tokens[i] = int32_t((int64_t(i) * 7 + ctx.step * 13 + ctx.micro) % 256);
      batch_targets[i] = int32_t((int64_t(i) * 7 + 7 + ctx.step * 13 + ctx.micro) % 256);
    }
    ex->write_as<int32_t>(toks[which], std::span<const int32_t>(batch_tokens));
    ex->write_as<int32_t>(tgts[which], std::span<const int32_t>(batch_targets));
  });
}

void TinyRun::step(int64_t step) {
  StepContext ctx;
  ctx.lr = 1e-3;
  ctx.step = step;
  ex->run_step(ctx);
}

void TinyRun::eval() { ex->run_section(SectionKind::eval, StepContext{}); }

float TinyRun::loss() const { return ex->read_scalar<float>(compiled.program.find_tensor(kLoss)); }

}  // namespace memfit::test
