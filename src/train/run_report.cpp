#include "train/run_report.hpp"


#include <cstdio>
#include <fstream>
#include <filesystem>
#include <map>

#include "core/bytes.hpp"
#include "core/error.hpp"
#include "graph/zero.hpp"
#include "plan/plan_report.hpp"
#include "train/adapter_files.hpp"
#include "train/run_checks.hpp"
#include "runtime/rss.hpp"
#include "train/weights.hpp"
#include "train/whole_weights.hpp"

namespace memfit {

namespace {

// Time per step by phase, over the training sections (validation excluded). Communication is
// the time the step spends in collective ops: starting them, and waiting for those that
// have not finished when their result is needed.
std::map<std::string, double> phase_milliseconds(const RunState& s, const LoopRecord& rec) {
  std::map<std::string, double> phase_ms;
  const Program& prog = s.program();
  if (rec.timed_steps == 0) return phase_ms;
  for (int i = 0; i < int(prog.ops().size()); ++i) {
    const int sec = prog.section_of_op(i);
    if (sec < 0 || prog.sections()[size_t(sec)].kind == SectionKind::eval) continue;
    phase_ms[std::string(phase_name(prog.op(i).phase))] +=
        1e3 * s.executor->op_seconds()[size_t(i)] / double(rec.timed_steps);
  }
  return phase_ms;
}

double flops_per_step(const Program& prog) {
  double flops = 0;
  for (int i = 0; i < int(prog.ops().size()); ++i) {
    const int s = prog.section_of_op(i);
    if (s >= 0) flops += prog.op(i).flops * double(prog.sections()[size_t(s)].runs_per_step());
  }
  return flops;
}

// adapter_config.json's base_model_name_or_path: the HF directory the base came from.
std::string adapter_base_name(const RunConfig& c) {
  if (c.load.empty()) return c.model;
  return c.load.ends_with(".safetensors") ? std::filesystem::path(c.load).parent_path().string() : c.load;
}

void save_if_asked(RunState& s) {
  const RunConfig& c = s.config;
  if (c.save.empty()) return;
  // The ZeRO pass shards masters (and at stage 3 parameters) at any world size, one rank
  // included: then every rank takes part in the gathers. Rank 0 writes.
  // ZeRO shards over the data group (the world without tensor parallelism, where it is the
  // world's communicator itself): a tensor rank's slices are gathered there first, then the
  // slices over the tensor group.
  std::vector<std::vector<float>> whole;
  if (s.run.policy.zero_stage >= 1) whole = gather_whole_parameters(s.ex(), (*s.groups)[CommGroup::data], s.staging);
  if (c.topology.tensor > 1)
    whole = gather_tensor_parallel_trainable(s.ex(), (*s.groups)[CommGroup::tensor], s.staging,
                                             whole.empty() ? nullptr : &whole);
  if (s.rank == 0 && s.run.policy.lora.enabled()) {
    save_adapter(c.save, s.ex(), s.run.spec, s.run.policy.lora, adapter_base_name(c), s.staging,
                 whole.empty() ? nullptr : &whole);
    s.out() << fmt::format("saved the LoRA adapter (PEFT) to {}\n", c.save);
  } else if (s.rank == 0) {
    save_weights(c.save, s.ex(), s.run.spec, s.staging, whole.empty() ? nullptr : &whole, c.max_shard_bytes);
    s.out() << fmt::format("saved weights to {}\n", c.save);
  }
}

void write_report(const std::string& path, const nlohmann::json& report) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp);
    out << report.dump(2) << "\n";
    MEMFIT_CHECK(out.good(), "train", "cannot write the report to '{}'", path);
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    std::remove(tmp.c_str());
    throw Error("train", fmt::format("--report-json '{}' cannot be written: {}", path, std::strerror(err)));
  }
}

}  // namespace

nlohmann::json finish_run(RunState& s, const LoopRecord& rec, RunHooks* hooks) {
  const RunConfig& c = s.config;
  const Program& prog = s.program();
  const Policy& pol = s.run.policy;
  Executor& ex = s.ex();
  std::ostream& log = s.out();
  TierBytes measured{};
  for (Tier t : kAllTiers) measured[size_t(t)] = ex.buffer(t).measured_high_water();
  const uint64_t rss = peak_resident_set_bytes();
  // Every rank checks each of its tiers (arenas, the disk tier's file); the report says
  // whether all of them matched their plans.
  int32_t mismatched = 0;
  for (Tier t : kAllTiers) {
    const uint64_t planned = s.run.compiled.plan.tier(t).peak_bytes;
    if (t != Tier::device && planned == 0 && measured[size_t(t)] == 0) continue;
    const bool equal = planned == measured[size_t(t)];
    mismatched |= equal ? 0 : 1;
    log << fmt::format("memory: {} planned peak {} ({} bytes), measured high-water {} ({} bytes){}", tier_name(t),
                       format_bytes(planned), planned, format_bytes(measured[size_t(t)]), measured[size_t(t)],
                       equal ? ", equal" : ", DIFFERENT");
    log << (t == Tier::device ? fmt::format("; max RSS {}\n", format_bytes(rss)) : std::string("\n"));
  }
  log << describe_process_check(s.process, rss);
  s.comm->all_reduce(&mismatched, 1, DType::i32, ReduceOp::max);
  const double tokens_per_step = double(s.global_batch() * pol.seq * pol.grad_accum);
  const double seconds = rec.timed_seconds, steps = double(rec.timed_steps);
  const double tps = rec.timed_steps ? tokens_per_step * steps / seconds : 0.0;
  if (rec.timed_steps)
    log << fmt::format("speed: {:.0f} tokens/s, {:.1f} ms/step over steps 2..{}\n", tps, 1e3 * seconds / steps, c.steps);
  const std::map<std::string, double> phase_ms = phase_milliseconds(s, rec);
  nlohmann::json transfers = nlohmann::json::object();
  for (Queue q : {Queue::transfer_out, Queue::transfer_in}) {
    const TransferEngine::QueueStats t = ex.transfer_stats(q);
    if (t.transfers == 0 || rec.timed_steps == 0) continue;
    const double gbps = t.seconds > 0 ? double(t.bytes) / t.seconds / 1e9 : 0.0;
    transfers[std::string(queue_name(q))] = {{"bytes_per_step", double(t.bytes) / double(rec.timed_steps)},
                                             {"busy_ms_per_step", 1e3 * t.seconds / double(rec.timed_steps)},
                                             {"transfers_per_step", double(t.transfers) / double(rec.timed_steps)},
                                             {"gigabytes_per_second", gbps}};
    log << fmt::format("transfers {}: {} per step in {:.1f} ms of the worker's time ({:.2f} GB/s)\n", queue_name(q),
                       format_bytes(t.bytes / uint64_t(rec.timed_steps)), 1e3 * t.seconds / double(rec.timed_steps),
                       gbps);
  }
  // Once per run, after the last update: no weight file or report comes from a diverged state.
  require_finite_state(ex, c, c.steps, s.staging,
                       c.save.empty() ? "the run's report" : fmt::format("--save '{}'", c.save));
  save_if_asked(s);

  const double flops = flops_per_step(prog);
  nlohmann::json report;
  report["steps"] = c.steps;
  report["tokens_per_step"] = tokens_per_step;
  report["tokens_per_second"] = tps;
  report["ms_per_step_by_phase"] = phase_ms;
  report["transfers"] = transfers;
  report["ms_per_step"] = rec.timed_steps ? 1e3 * seconds / steps : 0.0;
  // CPU time of all threads: on a shared machine it varies far less than wall time, so
  // benchmarks compare it too (with one thread it is the step's work alone).
  report["cpu_ms_per_step"] = rec.timed_steps ? 1e3 * rec.timed_cpu_seconds / steps : 0.0;
  report["flops_per_step"] = flops;
  report["gflops_per_second"] = rec.timed_steps ? flops * steps / seconds / 1e9 : 0.0;
  report["loss"] = {{"first", rec.first_loss}, {"last", rec.last_loss}, {"history", rec.history}};
  report["validation"] = {{"history", rec.val_history},
                          {"last", rec.final_val ? nlohmann::json(*rec.final_val) : nlohmann::json()}};
  report["model"] = model_json(s.run.spec, prog.parameter_count());
  report["policy"] = policy_json(pol);
  report["data"] = {{"source", s.data->description()}, {"tokens", s.data->size()}, {"validation_tokens", s.val_tokens}};
  report["memory"] = memory_json(prog, s.run.compiled.plan, measured);
  report["memory"]["max_rss_bytes"] = rss;
  report["memory"]["process"] = process_json(s.process, rss);
  report["memory"]["budget_bytes"] = s.budget;
  report["memory"]["all_ranks_equal"] = mismatched == 0;
  report["distributed"] = {{"world_size", s.world}, {"rank", s.rank}, {"zero_stage", pol.zero_stage},
                           {"comm_bytes_per_step", communication_bytes_per_step(prog)},
                           {"communication", communication_json(prog, c.topology, c.ranks_per_node)}};
  report["optimizer_steps_applied"] = s.applied;
  if (s.runner->loss_scaling())
    report["loss_scaling"] = {
        {"convention", c.loss_scale.fixed_scale > 0 ? "fixed" : loss_scale_convention_name(c.loss_scale.convention)},
        {"final_scale", s.runner->loss_scale()},
        {"skipped_steps", s.runner->skipped_steps()},
        {"skipped_at", rec.skipped_at},
        {"history", rec.scale_history}};
  report["seed"] = c.seed;
  report["lr"] = c.lr;
  report["lr_schedule"] = s.schedule.to_json();
  report["lr_history"] = rec.lr_history;
  if (rec.has_grad_norm) report["grad_norm_history"] = rec.norm_history;
  if (hooks) hooks->after_run(ex, report, log);
  if (!c.report_json.empty() && s.rank == 0) write_report(c.report_json, report);
  return report;
}

}  // namespace memfit
