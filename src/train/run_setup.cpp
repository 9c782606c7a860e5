#include "train/run_setup.hpp"

#include "core/error.hpp"
#include "graph/training_program.hpp"
#include "graph/zero_hpz.hpp"
#include "plan/hpz_report.hpp"
#include "plan/plan_report.hpp"
#include "train/adapter_files.hpp"
#include "train/budget.hpp"
#include "train/checkpoint_agree.hpp"
#include "train/init.hpp"
#include "train/run_checks.hpp"
#include "train/synthetic_corpus.hpp"
#include "train/token_cache.hpp"
#include "train/weights.hpp"

namespace memfit {

namespace {

constexpr size_t kSyntheticBytes = 2 << 20;

TokenData open_data(const RunConfig& c, int ranks, std::ostream& log) {
  if (!c.tokenizer.empty()) {
    MEMFIT_CHECK(!c.data.empty(), "data", "--tokenizer needs --data FILE (a text file to tokenise)");
    return TokenData::open(tokenized_data(c.data, c.tokenizer, ranks, log), TokenFormat::automatic);
  }
  if (!c.data.empty()) return TokenData::open(c.data, c.data_format);
  const std::string text = synthetic_corpus(c.seed, kSyntheticBytes);
  std::vector<uint16_t> tokens(text.size());
  for (size_t i = 0; i < text.size(); ++i) tokens[i] = uint8_t(text[i]);
  return TokenData::from_tokens(std::move(tokens), fmt::format("the synthetic corpus (seed {})", c.seed));
}

// The world, this rank's topology and log, and the checks of the configuration itself.
void settle_ranks(RunState& s, const RunConfig& config, std::ostream& rank_log, Communicator* comm) {
  if (!comm) {
    s.own_comm = launched_with_several_ranks() ? make_mpi_communicator() : make_single_process_communicator();
    comm = s.own_comm.get();
  }
  s.comm = comm;
  const int W = comm->size(), rank = comm->rank(), tensor = config.topology.tensor;
  s.world = W, s.rank = rank;
  // A data degree above 1 comes from a plan's --world-size; the tensor degree alone leaves the
  // data degree to the launch.
  MEMFIT_CHECK(config.topology.data == 1 || config.topology.world() == W, "train",
               "--world-size {} but the run was launched with {} ranks", config.topology.world(), W);
  MEMFIT_CHECK(tensor >= 1 && W % tensor == 0, "train", "a tensor-parallel degree of {} does not divide {} ranks",
               tensor, W);
  s.config = config;
  RunConfig& c = s.config;
  if (!c.load_adapter.empty()) apply_adapter_config(c.load_adapter, c.policy.lora);
  c.topology = Topology{.data = W / tensor, .tensor = tensor, .rank = rank};
  // A LoRA run's adapter is small: its tensor-parallel slices (under ZeRO, its data group's
  // shards of them first) are gathered whole to save it.
  MEMFIT_CHECK(tensor == 1 || c.save.empty() || c.policy.lora.enabled(), "train",
               "--save of HF weights with tensor parallelism is not supported by this build yet: checkpoint with "
               "--checkpoint-dir (it resumes on any layout) and write HF weights with `memfit consolidate`");
  comm->set_timeout(c.comm_timeout);
  if (c.ranks_per_node == 0) c.ranks_per_node = comm->ranks_on_node();
  c.topology.ranks_per_node = c.ranks_per_node;  // --ranks-per-node overrides the node (tests force qgZ's hops)
  s.fault = TestFault::from_environment(rank);
  s.log = rank == 0 ? &rank_log : &s.quiet;
  MEMFIT_CHECK(c.steps >= 1, "train", "--steps must be at least 1 (got {})", c.steps);
  MEMFIT_CHECK(c.val_fraction >= 0 && c.val_fraction < 1, "train", "the validation fraction must be in [0, 1) (got {})",
               c.val_fraction);
  MEMFIT_CHECK(c.eval_every >= 0 && c.eval_batches >= 1, "train", "--eval-every must be >= 0 and --eval-batches >= 1");
  MEMFIT_CHECK(c.keep_checkpoints >= 1, "train", "--keep-checkpoints must be at least 1 (got {})", c.keep_checkpoints);
  s.schedule = lr_schedule_of(c);  // a resume keeps the checkpoint's horizon
  const ModelSpec spec = resolve_model(c.model);
  MEMFIT_CHECK(spec.rope_type == "default" || spec.rope_scaling.kind != RopeScaling::Kind::none, "train",
               "model '{}' scales its rotary embedding with rope_type '{}', which memfit's rope kernels do not "
               "compute (they do default, linear and llama3; memfit plan works for every type)", spec.name,
               spec.rope_type);
  MEMFIT_CHECK(c.resume.empty() || c.load.empty(), "train", "--resume and --load both give the weights; use one");
  check_output_paths(c, rank);
}

// The data, its split and the loaders; the validation split's tokens are checked here, before
// any step, since the first evaluation may come only after hours of training.
void open_splits(RunState& s) {
  const RunConfig& c = s.config;
  const TokenData& data = *s.data;
  const int64_t GB = s.global_batch(), T = s.run.policy.seq, vocab = s.run.spec.vocab_size;
  // Validation split from the end of the data; it must hold at least one batch.
  const int64_t n = data.size();
  if (s.run.policy.with_eval) s.val_tokens = std::max<int64_t>(int64_t(double(n) * c.val_fraction), GB * T + 1);
  MEMFIT_CHECK(s.val_tokens < n, "data", "{} holds {} tokens, too few for a validation split of {}",
               data.description(), n, s.val_tokens);
  s.train_loader.emplace(data, 0, n - s.val_tokens, GB, T, vocab, c.shuffle, c.seed, "training");
  if (s.run.policy.with_eval) {
    check_split_tokens(data, n - s.val_tokens, n, vocab, "validation");
    s.val_loader.emplace(data, n - s.val_tokens, n, GB, T, vocab, false, c.seed, "validation");
  }
}

// The executor with its weights (initialised or loaded) and the step runner feeding it.
void build_executor(RunState& s, RunHooks* hooks) {
  const RunConfig& c = s.config;
  const Program& prog = s.program();
  std::ostream& log = s.out();
  s.groups.emplace(*s.comm, c.topology, hpz_partition(s.run.policy, c.topology), &prog);
  s.process = plan_process(s);
  log << describe_process_plan(s.process);
  ExecutorOptions options;
  options.disk = BufferSite{s.config.offload_dir, s.rank,
                            DiskIo{s.config.disk_io.block_size, s.config.disk_io.queue_depth}};
  s.executor.emplace(s.run.compiled, *s.backend, &*s.groups, options);
  Executor& ex = s.ex();
  if (const std::string where = ex.buffer(Tier::disk).describe(); !where.empty())
    log << fmt::format("disk tier: {}\n", where);
  ex.set_timing(true);  // two clock reads per op: the report's time per phase
  load_run_weights(c, ex, s.run.spec, s.staging, !c.resume.empty());
  if (!c.load.empty()) log << fmt::format("loaded weights from {}\n", c.load);
  if (!c.load_adapter.empty()) log << fmt::format("loaded the LoRA adapter from {}\n", c.load_adapter);
  zero_persistent_state(ex, s.staging);
  const TensorId tokens = prog.find_tensor(kTokens), targets = prog.find_tensor(kTargets);
  const TensorId eval_tokens = prog.find_tensor(kEvalTokens), eval_targets = prog.find_tensor(kEvalTargets);
  // The training and validation batches have the same size (B x T tokens per rank).
  s.batch_tokens.assign(size_t(prog.tensor(tokens).numel()), 0);
  s.batch_targets.assign(size_t(prog.tensor(targets).numel()), 0);
  RunState* state = &s;
  s.runner.emplace(ex, [state, tokens, targets, eval_tokens, eval_targets](const Op& op, const StepContext&) {
    Executor& e = state->ex();
    const int d = state->config.topology.data_rank(), D = state->config.topology.data;
    const bool train = op.outputs[0] == tokens;
    BatchLoader& loader = train ? *state->train_loader : *state->val_loader;
    loader.next_for_rank(state->batch_tokens.data(), state->batch_targets.data(), d, D);
    e.write_as<int32_t>(train ? tokens : eval_tokens, std::span<const int32_t>(state->batch_tokens));
    e.write_as<int32_t>(train ? targets : eval_targets, std::span<const int32_t>(state->batch_targets));
  }, c.loss_scale, s.staging);
  if (s.runner->loss_scaling())
    log << fmt::format("loss scaling: {} convention, initial scale {}\n",
                       c.loss_scale.fixed_scale > 0 ? "fixed" : loss_scale_convention_name(c.loss_scale.convention),
                       s.runner->loss_scale());
  if (hooks) hooks->before_steps(ex, s.run);
}

// Where the steps start: step 1, or the step after a resumed checkpoint.
void resume_if_asked(RunState& s) {
  const RunConfig& c = s.config;
  std::ostream& log = s.out();
  const Policy& pol = s.run.policy;
  // Checkpoints record what the run is; a resume must match it (train/checkpoint.hpp).
  s.checkpoint_run = CheckpointRun{c.model, model_json(s.run.spec, s.program().parameter_count()), s.world,
                                   pol.zero_stage, pol.precision, pol.optimizer, s.train_loader->batches_per_epoch(),
                                   pol.grad_accum, s.runner->scaler() != nullptr, s.schedule, c.steps,
                                   s.global_batch(), c.shuffle};
  if (!c.resume.empty()) {
    s.resumed = resume_checkpoint(c.resume, s.ex(), s.staging, s.checkpoint_run, *s.comm);
    const TrainingPosition& at = s.resumed->at;
    for (const std::string& note : s.resumed->notes) log << "resume: " << note << "\n";
    for (const std::string& skipped : s.resumed->skipped) log << "resume: skipped " << skipped << "\n";
    MEMFIT_CHECK(at.step < c.steps, "train", "the checkpoint {} is at step {}, not before --steps {}", s.resumed->dir,
                 at.step, c.steps);
    s.first_step = at.step + 1;
    s.applied = at.applied;
    s.train_loader->seek(at.loader_epoch, at.loader_cursor);
    if (at.scaler) s.runner->scaler()->restore(*at.scaler);
    std::string schedule_note;
    s.schedule = resumed_lr_schedule(s.schedule, c.decay_steps > 0, c.steps, s.resumed->manifest, schedule_note);
    s.checkpoint_run.schedule = s.schedule;
    log << fmt::format("resumed from {} at step {}\n", s.resumed->dir, at.step);
    if (!schedule_note.empty()) log << "resume: " << schedule_note << "\n";
  }
  if (!c.checkpoint_dir.empty())
    for (const std::string& note : prepare_checkpoint_root(c.checkpoint_dir, s.resumed ? &*s.resumed : nullptr, *s.comm))
      log << "checkpoints: " << note << "\n";
}

}  // namespace

std::unique_ptr<RunState> setup_run(const RunConfig& config, std::ostream& rank_log, RunHooks* hooks,
                                    Communicator* comm) {
  auto state = std::make_unique<RunState>();
  RunState& s = *state;
  settle_ranks(s, config, rank_log, comm);
  const RunConfig& c = s.config;
  s.backend = make_backend(s.config.backend);
  s.data.emplace(open_data(c, s.world, s.out()));
  s.run = prepare_run(c, *s.backend);
  const ModelSpec& spec = s.run.spec;
  // Raw bytes are ids below 256: a larger vocabulary would train on the wrong tokens, silently.
  MEMFIT_CHECK(s.data->format() != TokenFormat::text || spec.vocab_size <= 256, "data",
               "{} is text, which memfit reads as bytes, but model '{}' has a vocabulary of {}: give its tokenizer "
               "(--tokenizer DIR) or tokenise first (memfit tokenize --tokenizer DIR --input FILE --out tokens.bin)",
               s.data->description(), spec.name, spec.vocab_size);
  const Policy& pol = s.run.policy;
  const Program& prog = s.program();
  open_splits(s);
  std::ostream& log = s.out();
  const int64_t n = s.data->size();
  log << fmt::format("memfit train: model {} ({} parameters), batch {} x {} tokens, accumulation {}, {}, {}, lr {} ({})\n",
                     spec.name, prog.parameter_count(), pol.batch, pol.seq, pol.grad_accum,
                     precision_name(pol.precision), optimizer_name(pol.optimizer), c.lr, s.schedule.to_json().dump());
  log << fmt::format("data: {}: {} tokens ({} training, {} validation)\n", s.data->description(), n,
                     n - s.val_tokens, s.val_tokens);
  if (c.topology.tensor > 1)
    log << fmt::format("tensor parallel: {} ranks per model replica x {} data-parallel replicas (ZeRO stage {} over "
                       "the data group); this rank holds {} of the model's parameters\n",
                       c.topology.tensor, c.topology.data, pol.zero_stage, prog.trainable_parameter_count());
  if (!c.config_note.empty()) log << fmt::format("config: {}\n", c.config_note);
  if (!c.deepspeed_note.empty()) log << fmt::format("config: {}\n", c.deepspeed_note);
  s.budget = run_budget(c);
  log << describe_recompute_choice(s.run, s.budget);
  log << format_memory_table(prog, s.run.compiled.plan);
  if (s.world > 1) log << describe_communication(prog, c.topology, c.ranks_per_node);
  log << describe_hpz(hpz_summary(prog, s.run.compiled.plan), hpz_partition(s.run.policy, c.topology));
  if (s.world == 1) {
    enforce_memory_budget(c, s.run, s.budget, *s.backend, log);
  } else {
    // Every rank checks its own plan, and they agree before any throws: a rank that threw
    // first would end the job while rank 0 still writes the diagnosis.
    const Outcome all =
        agree(*s.comm, attempt(Verdict::failed, [&] { enforce_memory_budget(c, s.run, s.budget, *s.backend, log); }));
    MEMFIT_CHECK(all.ok(), "plan", "{}", all.message);
  }
  build_executor(s, hooks);
  resume_if_asked(s);
  require_finite_start(s.ex(), c, s.staging);
  s.update_watch.emplace(s.ex(), s.staging);
  s.ex().add_observer(&*s.update_watch);
  return state;
}

}  // namespace memfit
