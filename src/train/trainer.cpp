#include "train/trainer.hpp"

#include <sys/resource.h>
#include <time.h>

#include <chrono>
#include <cmath>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>

#include "core/bytes.hpp"
#include "core/error.hpp"
#include "graph/optimizer.hpp"
#include "graph/training_program.hpp"
#include "graph/zero.hpp"
#include "plan/plan_report.hpp"
#include "runtime/executor.hpp"
#include "train/budget.hpp"
#include "train/checkpoint.hpp"
#include "train/data_loader.hpp"
#include "train/init.hpp"
#include "train/step_runner.hpp"
#include "train/synthetic_corpus.hpp"
#include "train/test_fault.hpp"
#include "train/weights.hpp"
#include "train/whole_weights.hpp"

namespace memfit {

namespace {

using Clock = std::chrono::steady_clock;

constexpr size_t kSyntheticBytes = 2 << 20;

double process_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

uint64_t max_rss_bytes() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return uint64_t(u.ru_maxrss) * 1024;
}

TokenData open_data(const RunConfig& c) {
  if (!c.data.empty()) return TokenData::open(c.data, c.data_format);
  const std::string text = synthetic_corpus(c.seed, kSyntheticBytes);
  std::vector<uint16_t> tokens(text.size());
  for (size_t i = 0; i < text.size(); ++i) tokens[i] = uint8_t(text[i]);
  return TokenData::from_tokens(std::move(tokens), fmt::format("the synthetic corpus (seed {})", c.seed));
}

}  // namespace

uint64_t run_budget(const RunConfig& c) { return c.memory_budget ? c.memory_budget : available_memory_bytes(); }

PreparedRun prepare_run(const RunConfig& c, const Backend& backend) {
  PreparedRun run;
  run.spec = resolve_model(c.model);
  run.policy = c.policy;
  run.policy.with_eval = c.val_fraction > 0;
  if (run.policy.recompute.mode == RecomputeMode::automatic && run.policy.recompute.blocks.empty()) {
    run.recompute_choice = choose_recompute(run.spec, run.policy, c.topology, run_budget(c),
                                            [&](Program& p) { attach_backend_scratch(p, backend); });
    run.policy.recompute.blocks = run.recompute_choice->blocks;
  }
  run.compiled = compile_program(build_training_program(run.spec, run.policy, c.topology), backend);
  return run;
}

std::string describe_recompute_choice(const PreparedRun& run, uint64_t budget) {
  if (!run.recompute_choice) return "";
  const RecomputeChoice& r = *run.recompute_choice;
  return fmt::format("recompute auto: {} ({:.1f} GFLOP recomputed per micro-step; peak {} {} the budget {}; {} "
                     "candidate programs planned)\n",
                     r.fits ? blocks_to_string(r.blocks) : "nothing fits, closest " + blocks_to_string(r.blocks),
                     r.recompute_flops / 1e9, format_bytes(r.peak_bytes), r.fits ? "within" : "above",
                     format_bytes(budget), r.planned);
}

nlohmann::json model_json(const ModelSpec& s, int64_t parameters) {
  return {{"name", s.name},         {"arch", arch_name(s.arch)}, {"n_layer", s.n_layer},
          {"n_head", s.n_head},     {"n_embd", s.n_embd},        {"vocab_size", s.vocab_size},
          {"padded_vocab", s.padded_vocab}, {"max_seq", s.max_seq}, {"parameters", parameters}};
}

nlohmann::json policy_json(const Policy& p) {
  return {{"batch", p.batch},
          {"seq", p.seq},
          {"grad_accum", p.grad_accum},
          {"precision", precision_name(p.precision)},
          {"grad_dtype", dtype_name(p.grad_dtype)},
          {"fp32_ops", p.fp32_ops},
          {"recompute", p.recompute.to_string()},
          {"attention", attention_name(p.attention)},
          {"optimizer", optimizer_name(p.optimizer)},
          {"grad_clip", p.grad_clip},
          {"optimizer_in_backward", p.update_in_backward},
          {"adamw", {{"beta1", p.adamw.beta1}, {"beta2", p.adamw.beta2}, {"eps", p.adamw.eps},
                     {"weight_decay", p.adamw.weight_decay}}},
          {"zero_stage", p.zero_stage},
          {"overlap_comm", p.overlap_comm},
          {"offload_optimizer", tier_name(p.offload_optimizer)},
          {"offload_params", tier_name(p.offload_params)},
          {"classifier_chunk_rows", p.classifier_chunk_rows}};
}

nlohmann::json run_training(const RunConfig& config, std::ostream& rank_log, RunHooks* hooks, Communicator* comm) {
  std::unique_ptr<Communicator> own_comm;
  if (!comm) {
    own_comm = launched_with_several_ranks() ? make_mpi_communicator() : make_single_process_communicator();
    comm = own_comm.get();
  }
  const int W = comm->size(), rank = comm->rank(), tensor = config.topology.tensor;
  MEMFIT_CHECK(config.topology.world() == 1 || config.topology.world() == W, "train",
               "--world-size {} but the run was launched with {} ranks", config.topology.world(), W);
  MEMFIT_CHECK(tensor >= 1 && W % tensor == 0, "train", "a tensor-parallel degree of {} does not divide {} ranks",
               tensor, W);
  RunConfig c = config;
  c.topology = Topology{.data = W / tensor, .tensor = tensor, .rank = rank};
  comm->set_timeout(c.comm_timeout);
  const TestFault fault = TestFault::from_environment(rank);
  std::ostringstream quiet;  // ranks other than 0 keep their lines to themselves
  std::ostream& log = rank == 0 ? rank_log : quiet;
  MEMFIT_CHECK(c.steps >= 1, "train", "--steps must be at least 1 (got {})", c.steps);
  MEMFIT_CHECK(c.val_fraction >= 0 && c.val_fraction < 1, "train", "the validation fraction must be in [0, 1) (got {})",
               c.val_fraction);
  MEMFIT_CHECK(c.eval_every >= 0 && c.eval_batches >= 1, "train", "--eval-every must be >= 0 and --eval-batches >= 1");
  MEMFIT_CHECK(c.keep_checkpoints >= 1, "train", "--keep-checkpoints must be at least 1 (got {})", c.keep_checkpoints);
  LrSchedule schedule = lr_schedule_of(c);  // a resume keeps the checkpoint's horizon
  {
    const ModelSpec spec = resolve_model(c.model);
    MEMFIT_CHECK(spec.rope_type == "default", "train",
                 "model '{}' scales its rotary embedding ('{}'); memfit's rope kernel rotates with the plain "
                 "rope_theta frequencies only (memfit plan works for it)", spec.name, spec.rope_type);
  }
  auto backend = make_cpu_backend();
  const TokenData data = open_data(c);
  const PreparedRun run = prepare_run(c, *backend);
  const ModelSpec& spec = run.spec;
  const Policy& pol = run.policy;
  const Program& prog = run.compiled.program;
  const int64_t B = pol.batch, T = pol.seq, k = pol.grad_accum;
  const int64_t GB = B * c.topology.data;  // the global batch: data-parallel rank d reads rows [d*B, (d+1)*B)

  // Validation split from the end of the data; it must hold at least one batch.
  const int64_t n = data.size();
  int64_t val_tokens = 0;
  if (pol.with_eval) val_tokens = std::max<int64_t>(int64_t(double(n) * c.val_fraction), GB * T + 1);
  MEMFIT_CHECK(val_tokens < n, "data", "{} holds {} tokens, too few for a validation split of {}", data.description(),
               n, val_tokens);
  BatchLoader train_loader(data, 0, n - val_tokens, GB, T, spec.vocab_size, c.shuffle, c.seed, "training");
  std::optional<BatchLoader> val_loader;
  if (pol.with_eval) val_loader.emplace(data, n - val_tokens, n, GB, T, spec.vocab_size, false, c.seed, "validation");

  log << fmt::format("memfit train: model {} ({} parameters), batch {} x {} tokens, accumulation {}, {}, {}, lr {} ({})\n",
                     spec.name, prog.parameter_count(), B, T, k, precision_name(pol.precision),
                     optimizer_name(pol.optimizer), c.lr, schedule.to_json().dump());
  log << fmt::format("data: {}: {} tokens ({} training, {} validation)\n", data.description(), n, n - val_tokens,
                     val_tokens);
  const uint64_t budget = run_budget(c);
  log << describe_recompute_choice(run, budget);
  log << format_memory_table(prog, run.compiled.plan);
  enforce_memory_budget(c, run, budget, *backend, log);

  const CommGroups groups(*comm, c.topology);
  Executor ex(run.compiled, *backend, &groups);
  ex.set_timing(true);  // two clock reads per op: the report's time per phase
  if (c.load.empty()) {
    initialize_parameters(ex, spec, c.seed);
  } else {
    load_weights(c.load, ex, spec);
    log << fmt::format("loaded weights from {}\n", c.load);
  }
  zero_persistent_state(ex);

  const TensorId tokens = prog.find_tensor(kTokens), targets = prog.find_tensor(kTargets);
  const TensorId eval_tokens = prog.find_tensor(kEvalTokens), eval_targets = prog.find_tensor(kEvalTargets);
  StepRunner runner(ex, [&](const Op& op, const StepContext&) {
    const int d = c.topology.data_rank(), D = c.topology.data;
    if (op.outputs[0] == tokens) train_loader.next_for_rank(ex.data_as<int32_t>(tokens), ex.data_as<int32_t>(targets), d, D);
    else val_loader->next_for_rank(ex.data_as<int32_t>(eval_tokens), ex.data_as<int32_t>(eval_targets), d, D);
  }, c.loss_scale);
  if (runner.loss_scaling())
    log << fmt::format("loss scaling: {} convention, initial scale {}\n",
                       c.loss_scale.fixed_scale > 0 ? "fixed" : loss_scale_convention_name(c.loss_scale.convention),
                       runner.loss_scale());
  const float* loss = ex.data_as<float>(prog.find_tensor(kLoss));
  const TensorId norm_id = prog.find_tensor(kGradNorm);  // present when clipping
  const float* grad_norm = norm_id != kNoTensor ? ex.data_as<float>(norm_id) : nullptr;
  if (hooks) hooks->before_steps(ex, run);

  auto evaluate = [&]() {
    val_loader->reset();
    const float* eval_loss = ex.data_as<float>(prog.find_tensor(kEvalLoss));
    double sum = 0;
    for (int64_t i = 0; i < c.eval_batches; ++i) {
      ex.run_section("eval", StepContext{});
      sum += *eval_loss;
    }
    return sum / double(c.eval_batches);
  };

  nlohmann::json history = nlohmann::json::array(), val_history = nlohmann::json::array();
  nlohmann::json lr_history = nlohmann::json::array(), norm_history = nlohmann::json::array();
  double timed_seconds = 0, timed_cpu_seconds = 0;
  int64_t timed_steps = 0;
  const double tokens_per_step = double(GB * T * k);
  const uint64_t planned = run.compiled.plan.tier(Tier::device).peak_bytes;
  float first_loss = NAN, last_loss = NAN;
  // Optimizer steps actually applied: a step skipped for a gradient overflow does not count
  // (AdamW's bias correction and the learning-rate schedule see only applied steps, as in
  // PyTorch's GradScaler and DeepSpeed).
  int64_t applied = 0, first_step = 1;
  // Checkpoints record what the run is; a resume must match it (train/checkpoint.hpp).
  CheckpointRun checkpoint_run{c.model, model_json(spec, prog.parameter_count()), W, pol.zero_stage, pol.precision,
                               pol.optimizer, train_loader.batches_per_epoch(), k, runner.scaler() != nullptr,
                               schedule, c.steps};
  std::optional<ResumedCheckpoint> resumed;
  if (!c.resume.empty()) {
    MEMFIT_CHECK(c.load.empty(), "train", "--resume and --load both give the weights; use one");
    resumed = resume_checkpoint(c.resume, ex, checkpoint_run, *comm);
    const TrainingPosition& at = resumed->at;
    for (const std::string& note : resumed->notes) log << "resume: " << note << "\n";
    for (const std::string& skipped : resumed->skipped) log << "resume: skipped " << skipped << "\n";
    MEMFIT_CHECK(at.step < c.steps, "train", "the checkpoint {} is at step {}, not before --steps {}", resumed->dir,
                 at.step, c.steps);
    first_step = at.step + 1;
    applied = at.applied;
    train_loader.seek(at.loader_epoch, at.loader_cursor);
    if (at.scaler) runner.scaler()->restore(*at.scaler);
    std::string schedule_note;
    schedule = resumed_lr_schedule(schedule, c.decay_steps > 0, c.steps, resumed->manifest, schedule_note);
    checkpoint_run.schedule = schedule;
    log << fmt::format("resumed from {} at step {}\n", resumed->dir, at.step);
    if (!schedule_note.empty()) log << "resume: " << schedule_note << "\n";
  }
  if (!c.checkpoint_dir.empty())
    for (const std::string& note : prepare_checkpoint_root(c.checkpoint_dir, resumed ? &*resumed : nullptr, *comm))
      log << "checkpoints: " << note << "\n";
  auto checkpoint = [&](int64_t step) {
    TrainingPosition at{step, applied, train_loader.epoch(), train_loader.cursor(), std::nullopt};
    if (runner.scaler()) at.scaler = runner.scaler()->state();
    const SavedCheckpoint saved = save_checkpoint(c.checkpoint_dir, ex, checkpoint_run, at, c.keep_checkpoints, *comm);
    log << fmt::format("step {:>5}/{} | checkpoint written to {}{}\n", step, c.steps, saved.dir,
                       saved.removed.empty() ? "" : fmt::format(" (removed {})", fmt::join(saved.removed, ", ")));
    if (!saved.warning.empty()) log << "warning: " << saved.warning << "\n";
    log.flush();  // a run killed later still shows which checkpoints are complete
  };
  nlohmann::json scale_history = nlohmann::json::array(), skipped_at = nlohmann::json::array();
  for (int64_t step = first_step; step <= c.steps; ++step) {
    StepContext ctx;
    ctx.step = applied + 1;
    ctx.lr = schedule.at(applied + 1);
    if (hooks) hooks->before_step(step);
    fault.before_step(step);
    const auto t0 = Clock::now();
    const double cpu0 = process_cpu_seconds();
    const StepRunner::Result r = runner.run(ctx);
    const double dt = std::chrono::duration<double>(Clock::now() - t0).count();
    applied += r.applied ? 1 : 0;
    if (hooks) hooks->after_step(step, *loss);
    last_loss = *loss;
    if (step == first_step) first_loss = last_loss;
    MEMFIT_CHECK(std::isfinite(last_loss) || !r.applied, "train", "the loss became {} at step {}; lower --lr",
                 last_loss, step);
    history.push_back(last_loss);
    lr_history.push_back(ctx.lr);
    if (grad_norm) norm_history.push_back(*grad_norm);
    if (runner.loss_scaling()) {
      scale_history.push_back(r.scale);
      if (!r.applied) skipped_at.push_back(step);
    }
    if (step > first_step) timed_seconds += dt, timed_cpu_seconds += process_cpu_seconds() - cpu0, ++timed_steps;
    if (step == first_step) ex.reset_op_seconds();  // per-phase times skip the warm-up step too
    const std::string scaling = runner.loss_scaling() ? fmt::format(" | scale {:g}{} | skipped {}", r.scale,
                                                                    r.applied ? "" : " (overflow: step skipped)",
                                                                    runner.skipped_steps())
                                                      : std::string();
    if (step == 1 || step == c.steps || !r.applied || (c.log_every > 0 && step % c.log_every == 0))
      log << fmt::format("step {:>5}/{} | loss {:.4f} | {:8.1f} ms | {:>9.0f} tok/s | lr {:.3g}{} | device {} planned{}\n",
                         step, c.steps, last_loss, dt * 1e3, tokens_per_step / dt, ctx.lr,
                         grad_norm ? fmt::format(" | norm {:.3f}", *grad_norm) : "", format_bytes(planned), scaling);
    if (!c.checkpoint_dir.empty() && (c.checkpoint_every > 0 ? step % c.checkpoint_every == 0 : step == c.steps))
      checkpoint(step);
    if (pol.with_eval && c.eval_every > 0 && step % c.eval_every == 0 && step != c.steps) {
      const double v = evaluate();
      val_history.push_back({{"step", step}, {"loss", v}});
      log << fmt::format("step {:>5}/{} | validation loss {:.4f} ({} batches)\n", step, c.steps, v, c.eval_batches);
    }
  }
  std::optional<double> final_val;
  if (pol.with_eval) {
    final_val = evaluate();
    val_history.push_back({{"step", c.steps}, {"loss", *final_val}});
    log << fmt::format("validation loss {:.4f} ({} batches of {} x {})\n", *final_val, c.eval_batches, B, T);
  }

  TierBytes measured{};
  for (Tier t : kAllTiers) measured[size_t(t)] = ex.arena(t).measured_high_water();
  const uint64_t rss = max_rss_bytes();
  // Every rank checks its own arena; the report says whether all of them matched their plans.
  int32_t mismatched = planned == measured[0] ? 0 : 1;
  comm->all_reduce(&mismatched, 1, DType::i32, ReduceOp::max);
  log << fmt::format("memory: device planned peak {} ({} bytes), measured high-water {} ({} bytes){}; max RSS {}\n",
                     format_bytes(planned), planned, format_bytes(measured[0]), measured[0],
                     planned == measured[0] ? ", equal" : ", DIFFERENT", format_bytes(rss));
  const double tps = timed_steps ? tokens_per_step * double(timed_steps) / timed_seconds : 0.0;
  if (timed_steps) log << fmt::format("speed: {:.0f} tokens/s, {:.1f} ms/step over steps 2..{}\n", tps,
                                      1e3 * timed_seconds / double(timed_steps), c.steps);
  // Time per step by phase, over the training sections (validation excluded). Communication is
  // the time the step spends in collective ops: starting them, and waiting for those that
  // have not finished when their result is needed.
  std::map<std::string, double> phase_ms;
  if (timed_steps > 0)
    for (int i = 0; i < int(prog.ops().size()); ++i) {
      const int s = prog.section_of_op(i);
      if (s < 0 || prog.sections()[size_t(s)].name == "eval") continue;
      phase_ms[std::string(phase_name(prog.op(i).phase))] += 1e3 * ex.op_seconds()[size_t(i)] / double(timed_steps);
    }
  if (!c.save.empty()) {
    // The ZeRO pass shards masters (and at stage 3 parameters) at any world size, one rank
    // included: then every rank takes part in the gathers. Rank 0 writes.
    std::vector<std::vector<float>> whole;
    if (pol.zero_stage >= 1) whole = gather_whole_parameters(ex, *comm);
    if (rank == 0) {
      save_weights(c.save, ex, spec, whole.empty() ? nullptr : &whole);
      log << fmt::format("saved weights to {}\n", c.save);
    }
  }

  double flops_per_step = 0;
  for (int i = 0; i < int(prog.ops().size()); ++i) {
    const int s = prog.section_of_op(i);
    const Section& sec = prog.sections()[size_t(s)];
    if (sec.name == "micro") flops_per_step += prog.op(i).flops * double(sec.repeat);
    else if (sec.name == "optimizer") flops_per_step += prog.op(i).flops;
  }
  nlohmann::json report;
  report["steps"] = c.steps;
  report["tokens_per_step"] = tokens_per_step;
  report["tokens_per_second"] = tps;
  report["ms_per_step_by_phase"] = phase_ms;
  report["ms_per_step"] = timed_steps ? 1e3 * timed_seconds / double(timed_steps) : 0.0;
  // CPU time of all threads: on a shared machine it varies far less than wall time, so
  // benchmarks compare it too (with one thread it is the step's work alone).
  report["cpu_ms_per_step"] = timed_steps ? 1e3 * timed_cpu_seconds / double(timed_steps) : 0.0;
  report["flops_per_step"] = flops_per_step;
  report["gflops_per_second"] = timed_steps ? flops_per_step * double(timed_steps) / timed_seconds / 1e9 : 0.0;
  report["loss"] = {{"first", first_loss}, {"last", last_loss}, {"history", history}};
  report["validation"] = {{"history", val_history}, {"last", final_val ? nlohmann::json(*final_val) : nlohmann::json()}};
  report["model"] = model_json(spec, prog.parameter_count());
  report["policy"] = policy_json(pol);
  report["data"] = {{"source", data.description()}, {"tokens", n}, {"validation_tokens", val_tokens}};
  report["memory"] = memory_json(prog, run.compiled.plan, measured);
  report["memory"]["max_rss_bytes"] = rss;
  report["memory"]["budget_bytes"] = budget;
  report["memory"]["all_ranks_equal"] = mismatched == 0;
  const double comm_bytes = communication_bytes_per_step(prog);
  report["distributed"] = {{"world_size", W}, {"rank", rank}, {"zero_stage", pol.zero_stage},
                           {"comm_bytes_per_step", comm_bytes}};
  report["optimizer_steps_applied"] = applied;
  if (runner.loss_scaling())
    report["loss_scaling"] = {
        {"convention", c.loss_scale.fixed_scale > 0 ? "fixed" : loss_scale_convention_name(c.loss_scale.convention)},
        {"final_scale", runner.loss_scale()},
        {"skipped_steps", runner.skipped_steps()},
        {"skipped_at", skipped_at},
        {"history", scale_history}};
  report["seed"] = c.seed;
  report["lr"] = c.lr;
  report["lr_schedule"] = schedule.to_json();
  report["lr_history"] = lr_history;
  if (grad_norm) report["grad_norm_history"] = norm_history;
  if (hooks) hooks->after_run(ex, report, log);
  if (!c.report_json.empty() && rank == 0) {
    const std::string tmp = c.report_json + ".tmp";
    {
      std::ofstream out(tmp);
      out << report.dump(2) << "\n";
      MEMFIT_CHECK(out.good(), "train", "cannot write the report to '{}'", c.report_json);
    }
    std::rename(tmp.c_str(), c.report_json.c_str());
  }
  return report;
}

}  // namespace memfit
