// A LoRA run of a torch fixture's HF base with a PEFT adapter directory, fed the fixture's
// batch: the base loaded as --load does, the adapter's settings and tensors as --load-adapter
// does (shared by the LoRA and QLoRA parity tests).
#pragma once

#include <memory>
#include <string>

#include "graph/model_spec.hpp"
#include "graph/policy.hpp"
#include "io/safetensors.hpp"
#include "runtime/executor.hpp"
#include "train/tensor_staging.hpp"

namespace memfit::test {

struct AdapterRun {
  // `base_dir` holds config.json, model.safetensors and batch.safetensors; `policy` gives what
  // the run chooses (precision, attention, a quantised base, AdamW); batch, sequence and LoRA
  // come from the fixture and the adapter.
  // An adapter whose init_lora_weights rewrites the base (olora, pissa) starts from it first, as
  // PEFT loads one; load_adapter_weights false keeps that start instead of the file's A and B.
  AdapterRun(const std::string& base_dir, const std::string& adapter_dir, Policy policy,
             bool load_adapter_weights = true);
  AdapterRun(const AdapterRun&) = delete;  // the executor refers to `compiled`
  AdapterRun& operator=(const AdapterRun&) = delete;
  float micro_step();  // forward and backward of the batch: the loss (gradients in place)
  // `steps` optimizer steps on the batch at `lr`: the loss before each update.
  std::vector<float> optimizer_steps(int steps, float lr);

  std::string dir;
  ModelSpec spec;
  std::unique_ptr<Backend> backend;
  SafetensorsReader batch;
  LoraPolicy lora;
  CompiledProgram compiled;
  std::unique_ptr<Executor> ex;
  TensorStaging staging;
  int64_t rows = 0;
};

}  // namespace memfit::test
