// A committed PyTorch fixture (tools/make_gpt2_fixtures.py, tools/make_llama_fixtures.py) as a
// memfit run: the training program of the fixture's config.json, its HF weights loaded, its
// batch fed to every micro-step; and the checks every parity test makes against it.
#pragma once

#include <memory>
#include <string>

#include "graph/training_program.hpp"
#include "io/safetensors.hpp"
#include "runtime/executor.hpp"

namespace memfit::test {

struct TorchFixtureRun {
  // `weights`: where the weights load from (a file, directory or sharded index), when not the
  // fixture's own model.safetensors.
  explicit TorchFixtureRun(const std::string& fixture, AttentionKind attention = AttentionKind::plain,
                           const std::string& weights = "");
  std::string dir;
  ModelSpec spec;
  std::unique_ptr<Backend> backend;
  CompiledProgram compiled;
  std::unique_ptr<Executor> ex;
  SafetensorsReader batch, expected;
  Shape batch_shape;  // [B, T]
  int64_t rows = 0;   // B * T
};

// Runs the micro-step: per-token losses against cross-entropy of PyTorch's logits and the mean
// loss to 1e-5 relative, then every parameter gradient to 1e-4 of its largest element (HF
// tensors: GPT-2's Conv1D weights transposed, llama's q|k|v split), padded vocabulary rows
// exactly zero, and every grad.* of the fixture compared.
void expect_loss_and_gradients_match(TorchFixtureRun& run);

// Three AdamW steps (lr 1e-3, the fixture's betas, eps and decay) follow PyTorch's losses to 1e-4.
void expect_adamw_losses_match(TorchFixtureRun& run);

}  // namespace memfit::test
