// Bandwidth of the optimizer section on a real program: the GPT-2 124M training program is
// built and planned as `memfit train` builds it, one whole step runs (so the gradients and
// moments hold real values), then the "optimizer" section alone runs --rounds times per
// optimizer with the executor's per-op timing. Each op's bytes moved per step (its reads
// plus its writes, once each) over its median time is its bandwidth; a STREAM-style triad
// over arrays of the same size, measured in the same process, is the machine's attainable
// bandwidth for comparison.
//
//   build/bench/optimizer_bench [--model gpt2] [--rounds 7] [--batch 1] [--seq 64]
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "graph/optimizer.hpp"
#include "graph/training_program.hpp"
#include "kernels/cpu/parallel.hpp"
#include "runtime/executor.hpp"
#include "train/init.hpp"
#include "kernels/backend.hpp"

namespace memfit {
namespace {

using Clock = std::chrono::steady_clock;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Bytes an optimizer op reads and writes once per step: its gradient inputs, and for the
// updates every output read and written back.
double op_bytes(const Program& p, const Op& op) {
  double bytes = 0;
  for (TensorId id : op.inputs) bytes += double(p.tensor(id).bytes());
  if (op.kind != OpKind::grad_norm)
    for (TensorId id : op.outputs) bytes += 2.0 * double(p.tensor(id).bytes());
  return bytes;
}

struct Result {
  std::string optimizer, op;
  double elements = 0, bytes = 0, ms = 0;
};

// y = a x + y over n floats (12 bytes moved per element): the attainable bandwidth.
class Triad {
 public:
  explicit Triad(int64_t n) : x_(size_t(n), 1.0f), y_(size_t(n), 2.0f) {}
  double seconds() {
    const auto t0 = Clock::now();
    float* y = y_.data();
    const float* x = x_.data();
    parallel_for(int64_t(y_.size()), kParallelGrain, [=](int64_t lo, int64_t hi) {
#pragma omp simd
      for (int64_t i = lo; i < hi; ++i) y[i] = 0.5f * x[i] + y[i];
    });
    return std::chrono::duration<double>(Clock::now() - t0).count();
  }
  double bytes() const { return 12.0 * double(y_.size()); }

 private:
  std::vector<float> x_, y_;
};

// The training program of one optimizer, after one whole step (real gradients and moments).
class OptimizerRun {
 public:
  OptimizerRun(const ModelSpec& spec, OptimizerKind kind, int64_t batch, int64_t seq) : kind_(kind) {
    Policy pol;
    pol.batch = batch;
    pol.seq = seq;
    pol.optimizer = kind;
    pol.grad_clip = 1.0;
    pol.with_eval = false;
    compiled_ = compile_program(build_training_program(spec, pol, {}, cpu_capabilities()), *backend_);
    const Program& p = compiled_.program;
    ex_ = std::make_unique<Executor>(compiled_, *backend_);
    initialize_parameters(*ex_, spec, 1);
    zero_persistent_state(*ex_);
    const TensorId tok = p.find_tensor(kTokens), tgt = p.find_tensor(kTargets);
    const int64_t n = p.tensor(tok).numel(), vocab = spec.vocab_size;
    tokens_.assign(size_t(n), 0);
    targets_.assign(size_t(n), 0);
    ex_->set_input_handler([this, tok, tgt, n, vocab](const Op&, const StepContext& ctx) {
      for (int64_t i = 0; i < n; ++i) {
        tokens_[size_t(i)] = int32_t((i * 31 + ctx.step) % vocab);
        targets_[size_t(i)] = int32_t((i * 31 + 7 + ctx.step) % vocab);
      }
      ex_->write_as<int32_t>(tok, std::span<const int32_t>(tokens_));
      ex_->write_as<int32_t>(tgt, std::span<const int32_t>(targets_));
    });
    StepContext ctx;
    ctx.lr = 1e-4;
    ex_->run_step(ctx);
    const Section* opt = p.find_section(SectionKind::optimizer);
    begin_ = opt->begin, end_ = opt->end;
  }

  // Runs the optimizer section once, timing each op.
  void time_section(int64_t step) {
    StepContext ctx;
    ctx.lr = 1e-4;
    ctx.step = step;
    for (int i = begin_; i < end_; ++i) {
      const auto t0 = Clock::now();
      ex_->run_ops(i, i + 1, ctx);
      times_[i].push_back(std::chrono::duration<double>(Clock::now() - t0).count());
    }
  }

  std::vector<Result> results() const {
    const Program& p = compiled_.program;
    std::vector<Result> out;
    for (int i = begin_; i < end_; ++i) {
      const Op& op = p.op(i);
      Result r;
      r.optimizer = optimizer_name(kind_);
      r.op = op.name;
      const size_t roles = op.kind == OpKind::adamw8bit ? 5 : 3;
      const size_t n = op.kind == OpKind::grad_norm ? op.inputs.size() : op.outputs.size() / roles;
      for (size_t t = 0; t < n; ++t) r.elements += double(p.tensor(op.inputs[t]).numel());
      r.bytes = op_bytes(p, op);
      r.ms = 1e3 * median(times_.at(i));
      out.push_back(r);
    }
    return out;
  }

 private:
  OptimizerKind kind_;
  std::unique_ptr<Backend> backend_ = make_cpu_backend();
  CompiledProgram compiled_;
  std::unique_ptr<Executor> ex_;
  std::vector<int32_t> tokens_, targets_;  // the batch the input handler writes (sized once)
  int begin_ = 0, end_ = 0;
  std::map<int, std::vector<double>> times_;
};

}  // namespace
}  // namespace memfit

int main(int argc, char** argv) {
  using namespace memfit;
  std::string model = "gpt2";
  int rounds = 7;
  int64_t batch = 1, seq = 64;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--model") model = value;
    else if (flag == "--rounds") rounds = std::stoi(value);
    else if (flag == "--batch") batch = std::stoll(value);
    else if (flag == "--seq") seq = std::stoll(value);
    else {
      std::fprintf(stderr, "unknown argument %s\n", flag.c_str());
      return 2;
    }
  }
  try {
    const ModelSpec spec = model_preset(model);
    // The two optimizers and the triad alternate in every round, so all see the same load.
    OptimizerRun adamw(spec, OptimizerKind::adamw, batch, seq), q8(spec, OptimizerKind::adamw8bit, batch, seq);
    Triad triad(spec.parameter_count());
    std::vector<double> triad_seconds;
    for (int r = 0; r < rounds; ++r) {
      adamw.time_section(2 + r);
      q8.time_section(2 + r);
      triad_seconds.push_back(triad.seconds());
    }
    std::vector<Result> results = adamw.results();
    for (const Result& r : q8.results()) results.push_back(r);
    const double triad_gbps = triad.bytes() / median(triad_seconds) / 1e9;
    std::printf("model %s (%lld parameters), %d threads, median of %d rounds\n\n", model.c_str(),
                (long long)spec.parameter_count(), omp_get_max_threads(), rounds);
    std::printf("| optimizer | op | elements | bytes moved | ms | GB/s |\n|---|---|---|---|---|---|\n");
    std::map<std::string, double> total_ms;
    for (const Result& r : results) {
      std::printf("| %s | %s | %.1fM | %.0f MB | %.1f | %.1f |\n", r.optimizer.c_str(), r.op.c_str(), r.elements / 1e6,
                  r.bytes / 1e6, r.ms, r.bytes / (r.ms * 1e-3) / 1e9);
      total_ms[r.optimizer] += r.ms;
    }
    std::printf("\noptimizer section: adamw %.1f ms, adamw8bit %.1f ms (ratio %.2f); triad (y = a x + y, 12 B per "
                "element over %lld elements): %.1f GB/s\n",
                total_ms["adamw"], total_ms["adamw8bit"], total_ms["adamw8bit"] / total_ms["adamw"],
                (long long)spec.parameter_count(), triad_gbps);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "optimizer_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
