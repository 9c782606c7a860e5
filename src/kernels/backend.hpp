// The narrow interface between the step program and the code that computes. A Backend turns
// each op of a program into a PreparedOp whose tensor addresses are fixed (arenas never move),
// so that running a step is a loop of run() calls with no allocation and no lookups.
// Nothing above kernels/ knows which backend runs.
#pragma once

#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

#include "graph/capabilities.hpp"
#include "graph/program.hpp"
#include "memory/buffer_type.hpp"

namespace memfit {

// Values that change from step to step and are therefore not baked into the program.
struct StepContext {
  int64_t step = 1;         // optimizer step, 1-based (AdamW bias correction)
  double lr = 0;            // learning rate of this step
  float loss_scale = 1;     // multiplies d(loss)/d(logits) (fp16 loss scaling); 1 otherwise
  int micro = 0;            // index of the micro-step within the optimizer step
  int micro_count = 1;      // micro-steps per optimizer step
  uint64_t seed = 0;        // the run's seed: dropout masks are a function of (seed, step, micro)
  int64_t position = 0;     // generation: the position of the first token an op runs over (graph/op.hpp)
};

// Whether an output written with `mode` is accumulated into (true) or overwritten (false).
inline bool accumulates(WriteMode mode, const StepContext& ctx) {
  switch (mode) {
    case WriteMode::overwrite: return false;
    case WriteMode::accumulate: return true;
    case WriteMode::update: return true;
    case WriteMode::accumulate_after_first_micro: return ctx.micro > 0;
  }
  return false;
}

// Addresses of an op's tensors, in the op's order; nullptr for an output that is kNoTensor.
struct OpBinding {
  std::vector<void*> inputs;
  std::vector<void*> outputs;
  std::vector<void*> workspace;
};

class PreparedOp {
 public:
  virtual ~PreparedOp() = default;
  virtual void run(const StepContext& ctx) = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string_view name() const = 0;
  // The kinds and dtypes this backend computes natively; the precision pass builds programs for
  // it (build_training_program). prepare() checks the op contract (kernels/op_contract.hpp) and
  // refuses, naming the op, a dtype combination it has no kernel for.
  virtual const OpCapabilities& capabilities() const = 0;
  bool supports(OpKind kind, DType dtype) const { return capabilities().supports(kind, dtype); }
  // Bytes of library scratch the op's kernel needs beyond the op's own workspace tensors
  // (oneDNN's user scratchpad on the CPU). Before planning, the op gets a uint8 workspace
  // tensor of at least this size as its last workspace entry (runtime/compile.hpp), so the
  // plan counts it; prepare() requires it there.
  virtual uint64_t scratch_bytes(const Program& program, const Op& op) const = 0;
  // Throws [kernels] naming the op kind when this backend has no kernel for it.
  virtual std::unique_ptr<PreparedOp> prepare(const Program& program, const Op& op, const OpBinding& binding) = 0;
  // The memory that serves a tier: its alignment goes to the planner, and the executor
  // allocates the tier's buffer from it (memory/buffer_type.hpp).
  virtual const BufferType& buffer_type(Tier tier) const { return default_buffer_type(tier); }
};

// The CPU backend: oneDNN for matrix products, OpenMP loops for the rest.
std::unique_ptr<Backend> make_cpu_backend();
const OpCapabilities& cpu_capabilities();
// The reference backend: the naive kernels of kernels/reference (fp32, double accumulation),
// a second implementation of the op contract (kernels/op_contract.hpp) to test backends against.
std::unique_ptr<Backend> make_reference_backend();
const OpCapabilities& reference_capabilities();
// The one place a backend is chosen by name: "cpu" or "reference"; throws [kernels] listing them.
std::unique_ptr<Backend> make_backend(std::string_view name);
inline constexpr std::string_view kBackendNames[] = {"cpu", "reference"};

}  // namespace memfit
