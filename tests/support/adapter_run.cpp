#include "support/adapter_run.hpp"

#include "graph/training_program.hpp"
#include "io/hf_config.hpp"
#include "kernels/backend.hpp"
#include "train/adapter_files.hpp"
#include "train/init.hpp"
#include "train/lora_base_start.hpp"
#include "train/weights.hpp"

namespace memfit::test {

AdapterRun::AdapterRun(const std::string& base_dir, const std::string& adapter_dir, Policy pol,
                       bool load_adapter_weights)
    : dir(base_dir), spec(read_hf_config(base_dir + "/config.json")), backend(make_cpu_backend()),
      batch(base_dir + "/batch.safetensors") {
  const Shape bt = batch.find("tokens")->shape;
  rows = bt.numel();
  pol.batch = bt[0];
  pol.seq = bt[1];
  pol.with_eval = false;
  apply_adapter_config(adapter_dir, pol.lora);
  lora = pol.lora;
  compiled = compile_program(build_training_program(spec, pol, {}, cpu_capabilities()), *backend);
  ex = std::make_unique<Executor>(compiled, *backend);
  BaseStart start(lora, 0);
  load_weights(base_dir + "/model.safetensors", *ex, spec, staging, &start);
  start.start(*ex, staging);
  if (load_adapter_weights) load_adapter(adapter_dir, *ex, spec, lora, staging);
  zero_persistent_state(*ex, staging);
  const TensorId tokens = compiled.program.find_tensor(kTokens), targets = compiled.program.find_tensor(kTargets);
  ex->set_input_handler([this, tokens, targets](const Op&, const StepContext&) {
    for (const auto& [name, id] : {std::pair{"tokens", tokens}, std::pair{"targets", targets}}) {
      const SafetensorsEntry* e = batch.find(name);
      ex->write(id, std::span<const std::byte>(batch.data(*e), size_t(rows) * sizeof(int32_t)));
    }
  });
}

float AdapterRun::micro_step() {
  StepContext ctx;
  ex->run_section(SectionKind::micro, ctx);
  return ex->read_scalar<float>(compiled.program.find_tensor(kLoss));
}

std::vector<float> AdapterRun::optimizer_steps(int steps, float lr) {
  const TensorId loss = compiled.program.find_tensor(kLoss);
  StepContext ctx;
  ctx.lr = lr;
  std::vector<float> losses;
  for (int step = 1; step <= steps; ++step) {
    ctx.step = step;
    ex->run_step(ctx);
    losses.push_back(ex->read_scalar<float>(loss));
  }
  return losses;
}

}  // namespace memfit::test
