#include "train/train_loop.hpp"

#include <time.h>

#include <chrono>
#include <cmath>

#include "core/bytes.hpp"
#include "core/error.hpp"
#include "graph/optimizer.hpp"
#include "graph/training_program.hpp"
#include "train/generate.hpp"
#include "train/run_checks.hpp"

namespace memfit {

namespace {

using Clock = std::chrono::steady_clock;

double process_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

double evaluate(RunState& s) {
  s.val_loader->reset();
  const TensorId eval_loss = s.program().find_tensor(kEvalLoss);
  double sum = 0;
  for (int64_t i = 0; i < s.config.eval_batches; ++i) {
    s.ex().run_section(SectionKind::eval, StepContext{});
    sum += s.ex().read_scalar<float>(eval_loss);
  }
  return sum / double(s.config.eval_batches);
}

void checkpoint(RunState& s, int64_t step) {
  const RunConfig& c = s.config;
  require_finite_state(s.ex(), c, step, s.staging,
                       fmt::format("the checkpoint of step {} in --checkpoint-dir '{}'", step, c.checkpoint_dir));
  TrainingPosition at{step, s.applied, s.train_loader->epoch(), s.train_loader->cursor(), std::nullopt};
  if (s.runner->scaler()) at.scaler = s.runner->scaler()->state();
  const SavedCheckpoint saved =
      save_checkpoint(c.checkpoint_dir, s.ex(), s.staging, s.checkpoint_run, at, c.keep_checkpoints, *s.comm);
  std::ostream& log = s.out();
  log << fmt::format("step {:>5}/{} | checkpoint written to {}{}\n", step, c.steps, saved.dir,
                     saved.removed.empty() ? "" : fmt::format(" (removed {})", fmt::join(saved.removed, ", ")));
  if (!saved.warning.empty()) log << "warning: " << saved.warning << "\n";
  log.flush();  // a run killed later still shows which checkpoints are complete
}

}  // namespace

LoopRecord run_train_loop(RunState& s, RunHooks* hooks) {
  const RunConfig& c = s.config;
  const Program& prog = s.program();
  Executor& ex = s.ex();
  StepRunner& runner = *s.runner;
  std::ostream& log = s.out();
  const bool with_eval = s.run.policy.with_eval;
  const TensorId loss_id = prog.find_tensor(kLoss);
  const TensorId norm_id = prog.find_tensor(kGradNorm);  // present when clipping
  const bool has_norm = norm_id != kNoTensor;
  const double tokens_per_step = double(s.global_batch() * s.run.policy.seq * s.run.policy.grad_accum);
  const uint64_t planned = s.run.compiled.plan.tier(Tier::device).peak_bytes;
  const int64_t applied_at_start = s.applied;
  LoopRecord rec;
  rec.has_grad_norm = has_norm;
  // Every rank samples (the weights agree at ZeRO stage <= 2), so every rank's planned section
  // is used; only rank 0's log is printed. The last step samples too.
  std::optional<TrainingSampler> sampler;
  if (c.sample_every > 0) sampler.emplace(c, ex, s.run.spec.vocab_size);
  for (int64_t step = s.first_step; step <= c.steps; ++step) {
    StepContext ctx;
    ctx.step = s.applied + 1;
    ctx.lr = s.schedule.at(s.applied + 1);
    ctx.seed = c.seed;
    if (hooks) hooks->before_step(step);
    s.fault.before_step(step);
    const auto t0 = Clock::now();
    const double cpu0 = process_cpu_seconds();
    const StepRunner::Result r = runner.run(ctx);
    const double dt = std::chrono::duration<double>(Clock::now() - t0).count();
    const int64_t updates_before = s.applied - applied_at_start;
    s.applied += r.applied ? 1 : 0;
    s.fault.after_step_ops(step, ex);
    const float loss = ex.read_scalar<float>(loss_id);  // a few bytes, no allocation
    const float grad_norm = has_norm ? ex.read_scalar<float>(norm_id) : 0.0f;
    if (hooks) hooks->after_step(step, loss);
    rec.last_loss = loss;
    if (step == s.first_step) rec.first_loss = rec.last_loss;
    if (!std::isfinite(rec.last_loss) && r.applied)
      throw Error("train", fmt::format("the loss became {} at step {}: {}", rec.last_loss, step,
                                       explain_non_finite_loss(ex, c, updates_before, s.update_watch->before_update(),
                                                               s.staging)));
    rec.history.push_back(rec.last_loss);
    rec.lr_history.push_back(ctx.lr);
    if (has_norm) rec.norm_history.push_back(grad_norm);
    if (runner.loss_scaling()) {
      rec.scale_history.push_back(r.scale);
      if (!r.applied) rec.skipped_at.push_back(step);
    }
    if (step > s.first_step)
      rec.timed_seconds += dt, rec.timed_cpu_seconds += process_cpu_seconds() - cpu0, ++rec.timed_steps;
    if (step == s.first_step) {  // per-phase times and transfer rates skip the warm-up step too
      ex.reset_op_seconds();
      ex.reset_transfer_stats();
    }
    const std::string scaling = runner.loss_scaling() ? fmt::format(" | scale {:g}{} | skipped {}", r.scale,
                                                                    r.applied ? "" : " (overflow: step skipped)",
                                                                    runner.skipped_steps())
                                                      : std::string();
    if (step == 1 || step == c.steps || !r.applied || (c.log_every > 0 && step % c.log_every == 0))
      log << fmt::format("step {:>5}/{} | loss {:.4f} | {:8.1f} ms | {:>9.0f} tok/s | lr {:.3g}{} | device {} planned{}\n",
                         step, c.steps, rec.last_loss, dt * 1e3, tokens_per_step / dt, ctx.lr,
                         has_norm ? fmt::format(" | norm {:.3f}", grad_norm) : "", format_bytes(planned), scaling);
    if (sampler && (step % c.sample_every == 0 || step == c.steps))
      log << fmt::format("step {:>5}/{} | sample: {}\n", step, c.steps, sampler->sample());
    if (!c.checkpoint_dir.empty() && (c.checkpoint_every > 0 ? step % c.checkpoint_every == 0 : step == c.steps))
      checkpoint(s, step);
    if (with_eval && c.eval_every > 0 && step % c.eval_every == 0 && step != c.steps) {
      const double v = evaluate(s);
      rec.val_history.push_back({{"step", step}, {"loss", v}});
      log << fmt::format("step {:>5}/{} | validation loss {:.4f} ({} batches)\n", step, c.steps, v, c.eval_batches);
    }
  }
  if (with_eval) {
    rec.final_val = evaluate(s);
    rec.val_history.push_back({{"step", c.steps}, {"loss", *rec.final_val}});
    log << fmt::format("validation loss {:.4f} ({} batches of {} x {})\n", *rec.final_val, c.eval_batches,
                       s.run.policy.batch, s.run.policy.seq);
  }
  return rec;
}

}  // namespace memfit
