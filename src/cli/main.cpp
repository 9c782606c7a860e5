// memfit: train transformer language models in the memory you have.
//   memfit train ...      train (see --help); --check-leaks adds the leak guard
//   memfit plan ...       build and plan the step program without running it; with --hardware,
//                         --world-size, ZeRO/offload, --fit, --compare or --emit: per rank on
//                         any hardware (cli/hardware_plan.hpp)
//   memfit profile ...    a few training steps with a trace (Perfetto) and an HTML report
//   memfit max-batch ...  the largest micro-batch that fits a memory budget
//   memfit eval ...       loss and perplexity on a token file, no training (cli/eval_command.hpp)
//   memfit generate ...   text from a model over a KV cache, in planned memory (cli/generate_command.hpp)
//   memfit tokenize ...   text -> llm.c token files with an HF tokenizer.json (cli/tokenize_command.hpp)
//   memfit merge-lora ... HF weights with a PEFT LoRA adapter merged in (cli/merge_lora_command.hpp)
//   memfit convert-lora ... an OLoRA / PiSSA adapter as plain LoRA of the original base (cli/convert_lora_command.hpp)
//   memfit consolidate .. HF weights from a training checkpoint of any layout (cli/consolidate_command.hpp)
// Errors print one line, "memfit: error: [piece] message", and exit with status 1, command-line
// usage errors included; --help exits with 0. Under mpirun with several ranks every error goes
// through fail_job (dist/communicator.hpp): the line names the rank ("memfit: error: [rank 1]
// [io] ...") and MPI_Abort ends every rank, so none is left waiting in a collective.
#include <cstdio>
#include <string>
#include <iostream>
#include <optional>

#include <CLI/CLI.hpp>

#include "cli/consolidate_command.hpp"
#include "cli/convert_lora_command.hpp"
#include "cli/eval_command.hpp"
#include "cli/generate_command.hpp"
#include "cli/hardware_plan.hpp"
#include "cli/options.hpp"
#include "cli/merge_lora_command.hpp"
#include "cli/tokenize_command.hpp"
#include "core/error.hpp"
#include "dist/communicator.hpp"
#include "kernels/backend.hpp"
#include "core/bytes.hpp"
#include "graph/training_program.hpp"
#include "graph/forward_rewrite.hpp"
#include "graph/zero.hpp"
#include "graph/zero_hpz.hpp"
#include "plan/hpz_report.hpp"
#include "plan/plan_compare.hpp"
#include "plan/plan_report.hpp"
#include "train/budget.hpp"
#include "train/leak_check.hpp"
#include "train/max_batch.hpp"
#include "train/profile.hpp"
#include "train/trainer.hpp"

namespace {

// A plan runs nowhere: without --ranks-per-node its ranks share one node.
int plan_ranks_per_node(const memfit::RunConfig& c) { return c.ranks_per_node > 0 ? c.ranks_per_node : c.topology.world(); }

int plan_command(const memfit::RunConfig& config, bool as_json) {
  using namespace memfit;
  auto backend = make_backend(config.backend);
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
                             {"candidates_planned", run.recompute_choice->planned},
                             {"classifier_chunk_rows", classifier_chunk_rows(run.spec, run.policy)}};
    j["tensors"] = p.tensors().size();
    j["distributed"] = {{"world_size", config.topology.world()}, {"rank", 0},
                        {"zero_stage", run.policy.zero_stage},
                        {"comm_bytes_per_step", communication_bytes_per_step(p)},
                        {"communication", communication_json(p, config.topology, plan_ranks_per_node(config))}};
    if (const HpzSummary h = hpz_summary(p, run.compiled.plan); h.buckets > 0)
      j["distributed"]["hpz"] = hpz_json(h, hpz_partition(run.policy, config.topology));
    if (const FrozenSummary f = summarize_frozen(p, run.policy); f.params > 0)
      j["frozen"] = {{"parameters", f.params}, {"elements", f.elements}, {"gradient_bytes_saved", f.gradient_bytes},
                     {"master_bytes_saved", f.master_bytes}, {"optimizer_state_bytes_saved", f.optimizer_bytes},
                     {"bytes_saved", f.total_bytes()},
                     {"bytes_saved_per_rank", frozen_savings_per_rank(f, run.policy, config.topology).total_bytes()}};
    if (fp32) j["compared_to_fp32"] = plan_comparison_json("fp32", fp32->compiled.plan, precision_name(run.policy.precision),
                                                           run.compiled.plan);
    std::cout << j.dump(2) << "\n";
  } else {
    std::cout << fmt::format("memfit plan: model {} ({} parameters), batch {} x {}, accumulation {}, {}, {} ops\n",
                             run.spec.name, p.parameter_count(), run.policy.batch, run.policy.seq,
                             run.policy.grad_accum, precision_name(run.policy.precision), p.ops().size());
    std::cout << describe_recompute_choice(run, run_budget(config));
    if (config.topology.world() > 1 || run.policy.zero_stage > 0)
      std::cout << fmt::format("{}: rank 0 of {}{}, ZeRO stage {}, {} sent per rank per step\n",
                               config.topology.tensor > 1 ? "tensor x data parallel" : "data parallel",
                               config.topology.world(),
                               config.topology.tensor > 1 ? fmt::format(" (tensor {} x data {})", config.topology.tensor,
                                                                         config.topology.data)
                                                          : std::string(),
                               run.policy.zero_stage, format_bytes(uint64_t(communication_bytes_per_step(p))));
    if (config.topology.world() > 1) std::cout << describe_communication(p, config.topology, plan_ranks_per_node(config));
    std::cout << describe_hpz(hpz_summary(p, run.compiled.plan), hpz_partition(run.policy, config.topology));
    if (const FrozenSummary f = summarize_frozen(p, run.policy); f.params > 0) {
      std::cout << fmt::format("frozen: {} parameters ({} elements) have no gradient, master or optimizer state: saves "
                               "{} (gradients {}, masters {}, optimizer state {})\n",
                               f.params, f.elements, format_bytes(uint64_t(f.total_bytes())),
                               format_bytes(uint64_t(f.gradient_bytes)), format_bytes(uint64_t(f.master_bytes)),
                               format_bytes(uint64_t(f.optimizer_bytes)));
      if (run.policy.zero_stage > 0 && config.topology.data > 1) {
        const FrozenSummary r = frozen_savings_per_rank(f, run.policy, config.topology);
        std::cout << fmt::format("frozen, per rank (ZeRO stage {} over {} ranks): saves {} (gradients {}, masters {}, "
                                 "optimizer state {})\n",
                                 run.policy.zero_stage, config.topology.data, format_bytes(uint64_t(r.total_bytes())),
                                 format_bytes(uint64_t(r.gradient_bytes)), format_bytes(uint64_t(r.master_bytes)),
                                 format_bytes(uint64_t(r.optimizer_bytes)));
      }
    }
    std::cout << format_memory_table(p, run.compiled.plan);
    if (fp32)
      std::cout << format_plan_comparison("fp32", fp32->compiled.plan, precision_name(run.policy.precision),
                                          run.compiled.plan);
    // With a budget, a plan that does not fit gets the same diagnosis `memfit train` prints.
    if (config.memory_budget > 0 && run.compiled.plan.tier(Tier::device).peak_bytes > config.memory_budget)
      std::cout << "memory budget exceeded:\n" << diagnose_budget(config, run, config.memory_budget, *backend).report;
  }
  return 0;
}

constexpr int64_t kProfileSteps = 3;

}  // namespace

int main(int argc, char** argv) {
  try {
    memfit::start_job();  // under mpirun: MPI from the first line on, so any rank can end the job
  } catch (const std::exception& e) {
    return memfit::fail_job(e.what());
  }
  CLI::App app{"memfit: train transformer language models in the memory you have"};
  app.require_subcommand(1);
  CLI::App* train = app.add_subcommand("train", "train a model");
  CLI::App* plan = app.add_subcommand("plan", "plan a run's memory without running it");
  CLI::App* profile = app.add_subcommand(
      "profile", "a few training steps (3 unless --steps) with a memory/time trace and a self-contained HTML report");
  CLI::App* max_batch = app.add_subcommand("max-batch", "the largest micro-batch that fits a memory budget");
  CLI::App* tokenize = app.add_subcommand("tokenize", "text files -> llm.c token files with an HF tokenizer.json");
  memfit::cli::TokenizeCommand tokenize_command(*tokenize);
  CLI::App* merge_lora = app.add_subcommand("merge-lora", "HF weights with a PEFT LoRA adapter merged in");
  memfit::cli::MergeLoraCommand merge_lora_command(*merge_lora);
  CLI::App* convert_lora = app.add_subcommand(
      "convert-lora", "an OLoRA / PiSSA adapter as a plain LoRA adapter of the original base (rank 2r)");
  memfit::cli::ConvertLoraCommand convert_lora_command(*convert_lora);
  const memfit::cli::ConsolidateCommand consolidate(app);
  memfit::cli::RunOptions train_options(*train, true);
  memfit::cli::RunOptions plan_options(*plan, false);
  memfit::cli::RunOptions profile_options(*profile, true);
  memfit::cli::RunOptions max_batch_options(*max_batch, false);
  memfit::cli::HardwarePlanOptions hardware_plan(*plan);
  const memfit::cli::EvalCommand eval(app);
  const memfit::cli::GenerateCommand generate(app);
  bool as_json = false, check_leaks = false, no_verify = false, max_batch_json = false;
  std::string profile_out = "memfit-profile";
  plan->add_flag("--json", as_json, "print the plan as JSON");
  train->add_flag("--check-leaks", check_leaks,
                  "poison dead buffers after their last op, check the arena between steps and that resident "
                  "memory stays flat after warm-up");
  profile->add_option("--out", profile_out, "output directory for trace.json and report.html (default memfit-profile)");
  max_batch->add_flag("--no-verify", no_verify, "do not run one real step at the answer");
  max_batch->add_flag("--json", max_batch_json, "print the answer as JSON");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help (CLI11's "Success" errors, exit code 0) prints as CLI11 does; every real parse
    // error is one line and status 1 like every other error, and ends every rank under mpirun.
    if (e.get_exit_code() == 0) return app.exit(e);
    std::string message = e.what();
    for (char& c : message)
      if (c == '\n') c = ' ';
    const std::string subcommand = app.get_subcommands().empty() ? "" : app.get_subcommands()[0]->get_name() + " ";
    return memfit::fail_job(fmt::format("[cli] {} (see memfit {}--help)", message, subcommand));
  }
  try {
    for (const auto* o : {&train_options, &plan_options, &profile_options})
      MEMFIT_CHECK(!o->seq_auto(), "policy", "--seq auto is only for max-batch; give a sequence length");
    if (tokenize->parsed()) return tokenize_command.run(std::cout);
    if (merge_lora->parsed()) return merge_lora_command.run(std::cout);
    if (convert_lora->parsed()) return convert_lora_command.run(std::cout);
    if (consolidate.parsed()) return consolidate.run(std::cout);
    if (train->parsed()) {
      memfit::LeakCheckHooks leak_hooks;
      memfit::run_training(train_options.resolve(), std::cout, check_leaks ? &leak_hooks : nullptr);
      return 0;
    }
    if (profile->parsed()) {
      memfit::RunConfig c = profile_options.resolve();
      if (profile->get_option("--steps")->count() == 0) c.steps = kProfileSteps;
      memfit::ProfileHooks hooks(c, profile_out);
      memfit::run_training(c, std::cout, &hooks);
      return 0;
    }
    if (eval.parsed()) return eval.run(std::cout);
    if (generate.parsed()) return generate.run(std::cout);
    if (max_batch->parsed()) {
      memfit::max_batch_command(max_batch_options.resolve(), max_batch_options.seq_auto(), !no_verify, max_batch_json,
                                std::cout);
      return 0;
    }
    memfit::RunConfig plan_config = plan_options.resolve();
    if (hardware_plan.requested(plan_config)) {
      hardware_plan.check_tensor_parallel_plan(plan_config.topology.tensor);
      return hardware_plan.run(plan_config, as_json, std::cout);
    }
    // This machine's backend: one rank of the real (ZeRO-transformed) program, rank 0.
    if (hardware_plan.world_size() > 0) {
      const int tensor = plan_config.topology.tensor;
      MEMFIT_CHECK(hardware_plan.world_size() % tensor == 0, "plan",
                   "--tensor-parallel {} does not divide --world-size {}", tensor, hardware_plan.world_size());
      plan_config.topology.data = hardware_plan.world_size() / tensor;
    }
    return plan_command(plan_config, as_json);
  } catch (const std::exception& e) {  // memfit::Error ("[piece] message") and the rest
    std::cout.flush();
    return memfit::fail_job(e.what());
  }
}
