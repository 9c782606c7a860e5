// memfit: train transformer language models in the memory you have.
//   memfit train ...   train (see --help)
//   memfit plan ...    build and plan the step program without running it
// Errors print one line, "memfit: error: [piece] message", and exit with status 1
// (2 for command-line usage errors).
#include <cstdio>
#include <iostream>
#include <optional>

#include <CLI/CLI.hpp>

#include "cli/options.hpp"
#include "core/error.hpp"
#include "kernels/backend.hpp"
#include "plan/plan_compare.hpp"
#include "plan/plan_report.hpp"
#include "train/trainer.hpp"

namespace {

int plan_command(const memfit::RunConfig& config, bool as_json) {
  using namespace memfit;
  auto backend = make_cpu_backend();
  const PreparedRun run = prepare_run(config, *backend);
  const Program& p = run.compiled.program;
  // Under bf16 / fp16, the same run in fp32 for comparison: what each category saves.
  std::optional<PreparedRun> fp32;
  if (run.policy.precision != Precision::fp32) {
    RunConfig base = config;
    base.policy.precision = Precision::fp32;
    base.policy.grad_dtype = DType::f32;
    base.policy.fp32_ops.clear();
    fp32 = prepare_run(base, *backend);
  }
  if (as_json) {
    nlohmann::json j;
    j["model"] = model_json(run.spec, p.parameter_count());
    j["policy"] = policy_json(run.policy);
    j["memory"] = memory_json(p, run.compiled.plan);
    j["ops"] = p.ops().size();
    if (run.recompute_choice)
      j["recompute_auto"] = {{"fits", run.recompute_choice->fits},
                             {"choice", blocks_to_string(run.recompute_choice->blocks)},
                             {"recompute_flops", run.recompute_choice->recompute_flops},
                             {"budget_bytes", run_budget(config)},
                             {"candidates_planned", run.recompute_choice->planned}};
    j["tensors"] = p.tensors().size();
    if (fp32) j["compared_to_fp32"] = plan_comparison_json("fp32", fp32->compiled.plan, precision_name(run.policy.precision),
                                                           run.compiled.plan);
    std::cout << j.dump(2) << "\n";
  } else {
    std::cout << fmt::format("memfit plan: model {} ({} parameters), batch {} x {}, accumulation {}, {}, {} ops\n",
                             run.spec.name, p.parameter_count(), run.policy.batch, run.policy.seq,
                             run.policy.grad_accum, precision_name(run.policy.precision), p.ops().size());
    std::cout << describe_recompute_choice(run, run_budget(config));
    std::cout << format_memory_table(p, run.compiled.plan);
    if (fp32)
      std::cout << format_plan_comparison("fp32", fp32->compiled.plan, precision_name(run.policy.precision),
                                          run.compiled.plan);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"memfit: train transformer language models in the memory you have"};
  app.require_subcommand(1);
  CLI::App* train = app.add_subcommand("train", "train a model");
  CLI::App* plan = app.add_subcommand("plan", "plan a run's memory without running it");
  memfit::cli::RunOptions train_options(*train, true);
  memfit::cli::RunOptions plan_options(*plan, false);
  bool as_json = false;
  plan->add_flag("--json", as_json, "print the plan as JSON");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    if (train->parsed()) {
      memfit::run_training(train_options.resolve(), std::cout);
      return 0;
    }
    return plan_command(plan_options.resolve(), as_json);
  } catch (const memfit::Error& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "memfit: error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "memfit: error: %s\n", e.what());
    return 1;
  }
}
