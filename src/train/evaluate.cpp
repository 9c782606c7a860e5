#include "train/evaluate.hpp"

#include <chrono>
#include <cmath>
#include <vector>

#include "core/bytes.hpp"
#include "core/error.hpp"
#include "graph/eval_program.hpp"
#include "graph/training_program.hpp"
#include "io/mapped_file.hpp"
#include "io/token_file.hpp"
#include "kernels/backend.hpp"
#include "plan/plan_report.hpp"
#include "runtime/compile.hpp"
#include "runtime/executor.hpp"
#include "runtime/rss.hpp"
#include "train/adapter_files.hpp"
#include "train/data_loader.hpp"
#include "train/init.hpp"
#include "train/tensor_staging.hpp"
#include "train/weights.hpp"

namespace memfit {

namespace {

// Consecutive batches from the start of the file, written into the program's input tensors
// through one pair of buffers allocated before the first batch.
class EvalInput {
 public:
  EvalInput(const TokenData& data, const Policy& p, int64_t vocab)
      : loader_(data, 0, data.size(), p.batch, p.seq, vocab, false, 0, "eval"),
        tokens_(size_t(p.batch * p.seq)),
        targets_(tokens_.size()) {}
  void operator()(Executor& ex, TensorId tokens, TensorId targets) {
    loader_.next(tokens_.data(), targets_.data());
    ex.write_as<int32_t>(tokens, tokens_);
    ex.write_as<int32_t>(targets, targets_);
  }
  int64_t batches_in_file() const { return loader_.batches_per_epoch(); }

 private:
  BatchLoader loader_;
  std::vector<int32_t> tokens_, targets_;
};

}  // namespace

nlohmann::json run_evaluation(const RunConfig& config, int64_t max_batches, std::ostream& log) {
  MEMFIT_CHECK(!config.data.empty(), "eval", "memfit eval needs --data FILE (a token file or text)");
  MEMFIT_CHECK(config.topology.world() == 1, "eval", "memfit eval runs on one rank");
  const ModelSpec spec = resolve_model(config.model);
  auto backend = make_backend(config.backend);
  Policy policy = config.policy;
  policy.with_eval = true;
  const CompiledProgram compiled = compile_program(build_eval_program(spec, policy, backend->capabilities()), *backend);
  const Program& program = compiled.program;
  const TokenData data = TokenData::open(config.data, config.data_format);
  const int64_t tokens_per_batch = policy.batch * policy.seq;
  MEMFIT_CHECK(data.size() > tokens_per_batch, "eval", "{} holds {} tokens, fewer than one batch of {} x {} + 1",
               data.description(), data.size(), policy.batch, policy.seq);
  EvalInput input(data, policy, spec.vocab_size);
  const int64_t batches =
      max_batches > 0 ? std::min(max_batches, input.batches_in_file()) : input.batches_in_file();

  Executor ex(compiled, *backend);
  TensorStaging staging;
  load_inference_weights(config, ex, spec, staging, log);
  zero_persistent_state(ex, staging);
  const TensorId tokens = program.find_tensor(kEvalTokens), targets = program.find_tensor(kEvalTargets);
  const TensorId loss_id = program.find_tensor(kEvalLoss);
  ex.set_input_handler([&](const Op&, const StepContext&) { input(ex, tokens, targets); });

  double sum = 0;
  float loss = 0;
  const auto start = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < batches; ++i) {
    ex.run_section(SectionKind::eval, StepContext{});
    ex.read_as<float>(loss_id, std::span<float>(&loss, 1));
    MEMFIT_CHECK(std::isfinite(loss), "eval", "the loss of batch {} is {}", i + 1, loss);
    sum += loss;
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const double mean = sum / double(batches);
  const uint64_t planned = compiled.plan.tier(Tier::device).peak_bytes;
  const uint64_t measured = ex.buffer(Tier::device).measured_high_water();
  const uint64_t rss = peak_resident_set_bytes();
  const double tokens_per_second = double(batches * tokens_per_batch) / seconds;
  log << fmt::format("eval: model {} on {}: {} batches of {} x {} ({} tokens)\n", spec.name, data.description(),
                     batches, policy.batch, policy.seq, batches * tokens_per_batch);
  log << fmt::format("loss {:.6f}, perplexity {:.4f}, {:.0f} tokens/s\n", mean, std::exp(mean), tokens_per_second);
  log << format_memory_table(program, compiled.plan);
  log << fmt::format("memory: device planned peak {} ({} bytes), measured high-water {} ({} bytes), {}; max RSS {}\n",
                     format_bytes(planned), planned, format_bytes(measured), measured,
                     planned == measured ? "equal" : "DIFFERENT", format_bytes(rss));
  nlohmann::json report;
  report["model"] = spec.name;
  report["data"] = data.description();
  report["batches"] = batches;
  report["tokens"] = batches * tokens_per_batch;
  report["parameters"] = program.parameter_count();
  report["loss"] = mean;
  report["perplexity"] = std::exp(mean);
  report["tokens_per_second"] = tokens_per_second;
  TierBytes measured_tiers{};
  for (Tier t : kAllTiers) measured_tiers[size_t(t)] = ex.buffer(t).measured_high_water();
  report["memory"] = memory_json(program, compiled.plan, measured_tiers);
  report["memory"]["planned_peak_bytes"] = planned;
  report["memory"]["measured_peak_bytes"] = measured;
  report["memory"]["max_rss_bytes"] = rss;
  if (!config.report_json.empty()) {
    const std::string text = report.dump(2) + "\n";
    AtomicFileWriter out(config.report_json, "eval");
    out.write(text.data(), text.size());
    out.commit();
  }
  MEMFIT_CHECK(planned == measured, "eval", "planned device peak {} bytes but measured {} bytes", planned, measured);
  return report;
}

}  // namespace memfit
