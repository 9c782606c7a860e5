// gpt2-tiny built, planned and ready to step in process, with deterministic tokens that the
// input handler computes into buffers of its own and writes (Executor::write; it allocates
// nothing): the common set-up of the runtime tests that watch steps (trace, leak guard,
// max-batch oracle).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "graph/policy.hpp"
#include "runtime/executor.hpp"

namespace memfit::test {

struct TinyRun {
  std::unique_ptr<Backend> backend;
  CompiledProgram compiled;
  std::unique_ptr<Executor> ex;
  std::vector<int32_t> batch_tokens, batch_targets;  // sized once: the handler fills and writes them

  explicit TinyRun(const Policy& policy, uint64_t seed = 7);
  // A program compiled (or altered) by the caller; `options` place a disk tier's file.
  // `model`: the preset the program was built from (its initialisation); `backend`: the one
  // the program was compiled for (default: the CPU backend).
  TinyRun(CompiledProgram compiled, uint64_t seed = 7, const ExecutorOptions& options = {},
          const std::string& model = "gpt2-tiny", std::unique_ptr<Backend> backend = nullptr);
  TinyRun(const TinyRun&) = delete;  // the executor refers to `compiled`
  TinyRun& operator=(const TinyRun&) = delete;
  void step(int64_t step);  // one optimizer step at lr 1e-3
  void eval();              // one pass of the "eval" section
  float loss() const;
};

CompiledProgram compile_tiny(const Policy& policy);

}  // namespace memfit::test
