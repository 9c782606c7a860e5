// Resuming collectively (see checkpoint.hpp). Rank 0 lists the candidates (a named step
// directory, or a root's step directories newest first) and reads each candidate's manifest;
// every rank parses the same bytes, checks them against its run, and validates its own rank
// file completely; the ranks agree; only then does each rank read its tensors (checking the
// checksum again, and agreeing again). A damaged candidate of a root is skipped and named;
// a sound checkpoint of another kind of run stops every rank at once (an older one would
// not fit either, and silently taking it would lose steps).
#include <filesystem>
#include <tuple>

#include "core/error.hpp"
#include "train/checkpoint.hpp"
#include "train/checkpoint_agree.hpp"
#include "train/checkpoint_dir.hpp"
#include "train/checkpoint_files.hpp"
#include "train/checkpoint_rank_file.hpp"
#include "train/checkpoint_reshard.hpp"

namespace memfit {

namespace {

namespace fs = std::filesystem;

struct Candidates {
  bool named = false;  // the user named one step directory: no fallback
  std::string root;
  std::vector<std::string> dirs;  // newest first
  std::vector<std::string> notes;
};

Candidates find_candidates(const std::string& path) {
  Candidates c;
  fs::path p = fs::path(path).lexically_normal();
  if (p.filename().empty()) p = p.parent_path();  // "ckpt/" names ckpt
  if (fs::exists(p / kManifestFile) || parse_step_dir_name(p.filename().string())) {
    c.named = true;
    c.root = (p.has_parent_path() ? p.parent_path() : fs::path(".")).string();
    c.dirs.push_back(p.string());
    return c;
  }
  MEMFIT_CHECK(fs::is_directory(p), "checkpoint", "'{}' is neither a checkpoint nor a directory of checkpoints", path);
  c.root = p.string();
  for (const StepDir& d : list_step_dirs(p)) c.dirs.push_back(d.path.string());
  MEMFIT_CHECK(!c.dirs.empty(), "checkpoint", "'{}' holds no checkpoint (no step-NNNNNN directory)", path);
  // `latest` is for tools and people; the scan finds the same directory, and also a save that
  // finished its manifest but died before moving the pointer.
  std::string problem;
  read_latest(p, problem);
  if (!problem.empty()) c.notes.push_back(problem + "; resuming from the newest valid directory instead");
  return c;
}

std::string serialize(const Candidates& c) {
  std::string text = fmt::format("{}\n{}\n", c.named ? 1 : 0, c.root);
  for (const std::string& d : c.dirs) text += d + "\n";
  return text;
}

Candidates deserialize(const std::string& text) {
  Candidates c;
  size_t at = 0;
  for (int line = 0; at < text.size(); ++line) {
    const size_t end = text.find('\n', at);
    const std::string s = text.substr(at, end - at);
    at = end + 1;
    if (line == 0) c.named = s == "1";
    else if (line == 1) c.root = s;
    else c.dirs.push_back(s);
  }
  return c;
}

// Why this run would not read, from the checkpoint's step on, the rows an uninterrupted run of
// its own layout reads there; "" when it would. A format 2 manifest knows batches only.
std::string data_mismatch(const CheckpointManifest& m, const CheckpointRun& run) {
  if (m.rows_per_batch == 0 || m.rows_per_batch == run.rows_per_batch) {
    if (m.batches_per_epoch != run.batches_per_epoch || m.batches_per_step != run.batches_per_step)
      return fmt::format("read {} batches per step from epochs of {}; this run reads {} per step from epochs of {} "
                         "(resuming needs the same data, --seq and rows per step: --batch x ranks x --grad-accum)",
                         m.batches_per_step, m.batches_per_epoch, run.batches_per_step, run.batches_per_epoch);
    if (m.rows_per_batch > 0 && m.shuffle != run.shuffle)
      return fmt::format("was written {} --shuffle; this run {} it", m.shuffle ? "with" : "without",
                         run.shuffle ? "uses" : "does not use");
    return "";
  }
  const int64_t rows = m.rows_per_batch * m.batches_per_step, ours = run.rows_per_batch * run.batches_per_step;
  if (rows != ours)
    return fmt::format("read {} rows per step ({} batches of {} rows); this run reads {} ({} of {}): keep --batch x "
                       "ranks x --grad-accum equal", rows, m.batches_per_step, m.rows_per_batch, ours,
                       run.batches_per_step, run.rows_per_batch);
  if (m.shuffle || run.shuffle)
    return fmt::format("read batches of {} rows in a shuffled order, which depends on the batch size; this run's "
                       "batches have {} rows (resume with --shuffle off or the same --batch x ranks)",
                       m.rows_per_batch, run.rows_per_batch);
  const int64_t epoch = m.rows_per_batch * m.batches_per_epoch, our_epoch = run.rows_per_batch * run.batches_per_epoch;
  if (epoch != our_epoch && m.step * rows > std::min(epoch, our_epoch))
    return fmt::format("read epochs of {} rows and is past the end of one; this run's epochs hold {} rows, so its "
                       "data order differs (choose --seq or data so that the epochs match)", epoch, our_epoch);
  return "";
}

// Why a sound manifest cannot continue this run; "" when it can.
std::string mismatch(const CheckpointManifest& m, const CheckpointRun& run) {
  if (!m.has_layout() && m.world_size != run.world_size)
    return fmt::format("was written by {} ranks without a global layout (an older memfit); resume it with the same "
                       "world size (this run has {})", m.world_size, run.world_size);
  if (!m.has_layout() && m.zero_stage != run.zero_stage)
    return fmt::format("was written with ZeRO stage {} without a global layout (an older memfit); this run uses "
                       "stage {}", m.zero_stage, run.zero_stage);
  nlohmann::json saved = m.model_spec, ours = run.model_spec;
  saved.erase("name"), ours.erase("name");
  if (saved != ours)
    return fmt::format("holds model '{}' ({}); this run's model '{}' differs ({})", m.model, m.model_spec.dump(),
                       run.model, run.model_spec.dump());
  if (m.precision != run.precision)
    return fmt::format("was written with precision {}; this run uses {}", precision_name(m.precision),
                       precision_name(run.precision));
  if (m.optimizer != run.optimizer)
    return fmt::format("holds {} state; this run uses {}", optimizer_name(m.optimizer), optimizer_name(run.optimizer));
  if (std::string why = data_mismatch(m, run); !why.empty()) return why;
  if (m.loss_scaler.has_value() != run.loss_scaler)
    return m.loss_scaler ? "holds a loss scaler's state; this run keeps none"
                         : "holds no loss scaler's state; this run needs one";
  return "";
}

// The same layout reads each rank's own file whole (the format 2 path); another one reads
// byte ranges of every file it needs.
bool same_layout(const CheckpointManifest& m, const CheckpointRun& run) {
  return m.world_size == run.world_size && m.zero_stage == run.zero_stage;
}

// Collective (every rank takes the same path): whether each rank's own file holds exactly this
// program's tensors. A format 2 checkpoint has no byte ranges to fall back on: it is read whole.
bool every_rank_file_lists_program_tensors(const fs::path& dir, const Program& program, Communicator& comm,
                                           const CheckpointManifest& m) {
  if (!m.has_layout()) return true;
  const RankFileEntry& entry = m.ranks[size_t(comm.rank())];
  const bool mine = rank_file_lists_program_tensors(dir / entry.file, program, entry);
  for (const std::string& r : all_gather_strings(comm, mine ? "1" : "0"))
    if (r != "1") return false;
  return true;
}

Outcome load_ranges(const fs::path& dir, Executor& ex, TensorStaging& staging, Communicator& comm,
                    const CheckpointManifest& m) {
  std::vector<std::vector<RangeRead>> plan;
  Outcome o = attempt(Verdict::incompatible, [&] {
    try {
      plan = plan_range_reads(m, ex.program(), comm.rank());
    } catch (const Error&) {
      throw Error("checkpoint", fmt::format("{}: {}", dir.string(), outcome_of_exception(Verdict::damaged).message));
    }
  });
  if (o.ok()) o = attempt(Verdict::damaged, [&] { check_range_files(dir, m, plan); });
  o = agree(comm, o);
  if (!o.ok()) return o;
  // A chunk that fails its checksum now is damage like any other: an older checkpoint is
  // tried, and it overwrites every tensor this one had partly filled.
  return agree(comm, attempt(Verdict::damaged, [&] { read_ranges(dir, m, plan, ex, staging); }));
}

// One candidate, collectively. On success the executor holds its tensors.
Outcome try_candidate(const fs::path& dir, Executor& ex, TensorStaging& staging, const CheckpointRun& run,
                      Communicator& comm,
                      CheckpointManifest& m) {
  const int rank = comm.rank();
  const fs::path manifest_path = dir / kManifestFile;
  std::string text;
  Outcome o = attempt(Verdict::damaged, [&] {
    if (rank != 0) return;
    MEMFIT_CHECK(fs::exists(manifest_path), "checkpoint", "{}: missing (its save did not finish)", manifest_path.string());
    text = read_bounded_file(manifest_path, kMaxManifestBytes);
  });
  o = agree(comm, o);
  if (!o.ok()) return o;
  broadcast_string(comm, text, 0);
  o = attempt(Verdict::damaged, [&] {
    try {
      m = parse_checkpoint_manifest(text);
    } catch (const Error& e) {
      throw Error("checkpoint", fmt::format("{}: {}", manifest_path.string(), outcome_of_exception(Verdict::damaged).message));
    }
  });
  if (o.ok()) {
    const std::string why = mismatch(m, run);
    if (!why.empty()) o = Outcome{Verdict::incompatible, fmt::format("{}: {}", dir.string(), why)};
  }
  o = agree(comm, o);
  if (!o.ok()) return o;
  if (!same_layout(m, run) || !every_rank_file_lists_program_tensors(dir, ex.program(), comm, m))
    return load_ranges(dir, ex, staging, comm, m);
  const RankFileIdentity who{rank, comm.size(), m.step};
  o = attempt(Verdict::damaged, [&] { validate_rank_file(dir / m.ranks[size_t(rank)].file, ex.program(), who, m.ranks[size_t(rank)]); });
  o = agree(comm, o);
  if (!o.ok()) return o;
  // Every rank's file is sound: load. A failure now means a file changed under us.
  o = agree(comm, attempt(Verdict::failed, [&] {
    read_rank_file(dir / m.ranks[size_t(rank)].file, ex, staging, who, m.ranks[size_t(rank)]);
  }));
  if (!o.ok()) o.message += " (it changed while being resumed)";
  return o;
}

}  // namespace

ResumedCheckpoint resume_checkpoint(const std::string& path, Executor& ex, TensorStaging& staging,
                                    const CheckpointRun& run,
                                    Communicator& comm) {
  Candidates found;
  std::string listing;
  Outcome o = attempt(Verdict::failed, [&] {
    if (comm.rank() != 0) return;
    found = find_candidates(path);
    listing = serialize(found);
  });
  o = agree(comm, o);
  if (!o.ok()) throw Error("checkpoint", o.message);
  broadcast_string(comm, listing, 0);
  const std::vector<std::string> notes = found.notes;  // rank 0's, for the log
  found = deserialize(listing);

  ResumedCheckpoint r;
  r.root = found.root;
  r.notes = notes;
  for (const std::string& dir : found.dirs) {
    const std::string name = fs::path(dir).filename().string();
    o = try_candidate(dir, ex, staging, run, comm, r.manifest);
    if (o.ok()) {
      r.dir = dir;
      const CheckpointManifest& m = r.manifest;
      r.at = TrainingPosition{m.step, m.applied, m.loader_epoch, m.loader_cursor, m.loss_scaler};
      // In rows, the data position is the checkpoint's; in this run's batches it is where an
      // uninterrupted run of this layout stands after the same steps (data_mismatch holds).
      if (m.has_layout() && m.rows_per_batch != run.rows_per_batch)
        std::tie(r.at.loader_epoch, r.at.loader_cursor) =
            loader_position_after(m.step * run.batches_per_step, run.batches_per_epoch);
      return r;
    }
    if (o.verdict != Verdict::damaged || found.named) throw Error("checkpoint", o.message);
    r.skipped.push_back(fmt::format("{}: {}", name, o.message));
  }
  std::string reasons;
  for (const std::string& s : r.skipped) reasons += (reasons.empty() ? "" : "; ") + s;
  throw Error("checkpoint", fmt::format("'{}' holds no valid checkpoint: {}", found.root, reasons));
}

LrSchedule resumed_lr_schedule(LrSchedule s, bool decay_steps_given, int64_t steps, const CheckpointManifest& m,
                               std::string& note) {
  const LrSchedule& saved = m.schedule;
  std::vector<std::string> notes;
  if (decay_steps_given && s.decay_steps != saved.decay_steps)
    notes.push_back(fmt::format("--decay-steps {} replaces the checkpoint's horizon of {} steps", s.decay_steps,
                                saved.decay_steps));
  if (!decay_steps_given) s.decay_steps = saved.decay_steps;
  if (steps != m.total_steps)
    notes.push_back(fmt::format("--steps is {}, the checkpoint's run was set to {}; the learning-rate schedule keeps "
                                "its horizon ({} decay to step {})", steps, m.total_steps, lr_schedule_name(s.kind),
                                s.decay_steps));
  if (s.kind != saved.kind || s.lr != saved.lr || s.warmup != saved.warmup ||
      (s.kind == LrScheduleKind::cosine && s.min_lr != saved.min_lr) || (s.deepspeed() && s.to_json() != saved.to_json()))
    notes.push_back(fmt::format("the learning-rate schedule {} differs from the checkpoint's {}", s.to_json().dump(),
                                saved.to_json().dump()));
  s.validate();
  note.clear();
  for (const std::string& n : notes) note += (note.empty() ? "" : "; ") + n;
  return s;
}

}  // namespace memfit
