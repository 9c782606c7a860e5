// Saving checkpoints collectively, and preparing a checkpoint root before the first save
// (see checkpoint.hpp). The order of a save, each step ending in an agreement of all ranks:
//   1. rank 0 creates ROOT/step-N/ (an unfinished leftover of the same name is removed);
//   2. every rank writes and fsyncs its file there and reports its size and checksum;
//   3. rank 0 checks every file's size and trailing checksum against its rank's report,
//      writes manifest.json (fsynced, by rename) and moves ROOT/latest to step-N;
//   4. rank 0 removes checkpoints beyond --keep-checkpoints (a failure there is a warning).
// A crash before 3 finishes leaves step-N without a manifest (or with one that `latest` does
// not name yet): never taken for complete, removed or set aside by the next run.
#include "train/checkpoint.hpp"

#include <filesystem>

#include "core/error.hpp"
#include "train/checkpoint_agree.hpp"
#include "train/checkpoint_dir.hpp"
#include "train/checkpoint_files.hpp"
#include "train/checkpoint_layout.hpp"
#include "train/checkpoint_rank_file.hpp"

namespace memfit {

namespace {

namespace fs = std::filesystem;

void throw_unless_ok(const Outcome& o) {
  if (!o.ok()) throw Error("checkpoint", o.message);
}

void create_step_dir(const fs::path& root, const fs::path& dir) {
  const bool new_root = !fs::exists(root);
  std::error_code ec;
  fs::create_directories(root, ec);
  MEMFIT_CHECK(!ec && fs::is_directory(root), "checkpoint", "cannot create the directory '{}': {}", root.string(),
               ec ? ec.message() : "not a directory");
  if (new_root) fsync_directory(fs::absolute(root).parent_path());
  if (fs::exists(dir)) {
    // Only an unfinished save of this step can be here (prepare_checkpoint_root cleared the
    // future); a complete one is never deleted.
    if (fs::exists(dir / kManifestFile)) set_aside(dir);
    else fs::remove_all(dir);
  }
  fs::create_directory(dir);
  fsync_directory(root);
}

CheckpointManifest manifest_of(const CheckpointRun& run, const TrainingPosition& at) {
  CheckpointManifest m;
  m.step = at.step;
  m.applied = at.applied;
  m.total_steps = run.total_steps;
  m.model = run.model;
  m.model_spec = run.model_spec;
  m.world_size = run.world_size;
  m.zero_stage = run.zero_stage;
  m.precision = run.precision;
  m.optimizer = run.optimizer;
  m.schedule = run.schedule;
  m.loader_epoch = at.loader_epoch;
  m.loader_cursor = at.loader_cursor;
  m.batches_per_epoch = run.batches_per_epoch;
  m.batches_per_step = run.batches_per_step;
  m.loss_scaler = at.scaler;
  m.rows_per_batch = run.rows_per_batch;
  m.shuffle = run.shuffle;
  return m;
}

// What each rank tells rank 0 about its file: size, checksums and the pieces it describes.
std::string report_of(const WrittenRankFile& written, const std::string& pieces) {
  std::string chunks;
  for (uint64_t c : written.entry.chunks) chunks += checksum_hex(c);
  return nlohmann::json{{"bytes", written.entry.bytes}, {"xxh3", checksum_hex(written.entry.xxh3)},
                        {"chunk_bytes", written.entry.chunk_bytes}, {"chunks", chunks}, {"pieces", pieces}}
      .dump();
}

RankFileEntry entry_of(const std::string& report, const std::string& file, std::string& pieces) {
  const nlohmann::json j = nlohmann::json::parse(report);
  RankFileEntry e{file, j.at("bytes").get<uint64_t>(), 0, j.at("chunk_bytes").get<uint64_t>(), {}};
  MEMFIT_ASSERT(parse_checksum_hex(j.at("xxh3").get<std::string>(), e.xxh3), "bad checksum in a rank's report");
  const std::string chunks = j.at("chunks").get<std::string>();
  for (size_t k = 0; k + 16 <= chunks.size(); k += 16) {
    uint64_t h = 0;
    MEMFIT_ASSERT(parse_checksum_hex(std::string_view(chunks).substr(k, 16), h), "bad chunk checksum in a report");
    e.chunks.push_back(h);
  }
  pieces = j.at("pieces").get<std::string>();
  return e;
}

// Rank 0, step 3: every rank's file is on disk as its rank reported it, then publish. The
// manifest is parsed back before it is written: its layout must pass the reader's checks.
void publish(const fs::path& root, const fs::path& dir, CheckpointManifest& m, const std::vector<std::string>& reports) {
  std::vector<std::string> pieces(reports.size());
  for (int r = 0; r < m.world_size; ++r) {
    const RankFileEntry reported = entry_of(reports[size_t(r)], rank_file_name(r, m.world_size), pieces[size_t(r)]);
    const RankFileEntry on_disk = rank_file_trailer(dir / reported.file);
    MEMFIT_CHECK(on_disk.bytes == reported.bytes && on_disk.xxh3 == reported.xxh3, "checkpoint",
                 "{}: is {} bytes with checksum {}, but rank {} wrote {} bytes with checksum {}",
                 (dir / reported.file).string(), on_disk.bytes, checksum_hex(on_disk.xxh3), r, reported.bytes,
                 checksum_hex(reported.xxh3));
    m.ranks.push_back(reported);
  }
  m.tensors = merge_descriptions(pieces);
  const std::string text = format_checkpoint_manifest(m);
  parse_checkpoint_manifest(text);
  replace_file_atomically(dir / kManifestFile, text);
  point_latest_at(root, dir.filename().string());
}

}  // namespace

SavedCheckpoint save_checkpoint(const std::string& root_name, const Executor& ex, TensorStaging& staging,
                                const CheckpointRun& run,
                                const TrainingPosition& at, int keep, Communicator& comm) {
  const int rank = comm.rank(), world = comm.size();
  MEMFIT_ASSERT(world == run.world_size && keep >= 1, "world {} vs {}, keep {}", world, run.world_size, keep);
  const fs::path root(root_name), dir = root / step_dir_name(at.step);
  throw_unless_ok(agree(comm, attempt(Verdict::failed, [&] {
    if (rank == 0) create_step_dir(root, dir);
  })));

  std::string report;
  throw_unless_ok(agree(comm, attempt(Verdict::failed, [&] {
    const WrittenRankFile written =
        write_rank_file(dir / rank_file_name(rank, world), ex, staging, RankFileIdentity{rank, world, at.step});
    report = report_of(written, describe_pieces(ex.program(), rank, written.root_offsets));
  })));
  const std::vector<std::string> reports = all_gather_strings(comm, report);

  CheckpointManifest m = manifest_of(run, at);
  throw_unless_ok(agree(comm, attempt(Verdict::failed, [&] {
    if (rank == 0) publish(root, dir, m, reports);
  })));

  SavedCheckpoint saved{dir.string(), {}, {}};
  if (rank == 0) {
    const Outcome o = attempt(Verdict::failed, [&] { saved.removed = remove_old_checkpoints(root, at.step, keep); });
    saved.warning = o.message;
  }
  return saved;
}

std::vector<std::string> prepare_checkpoint_root(const std::string& root_name, const ResumedCheckpoint* resumed,
                                                 Communicator& comm) {
  std::vector<std::string> notes;
  const Outcome o = attempt(Verdict::failed, [&] {
    const fs::path root(root_name);
    if (comm.rank() != 0 || !fs::exists(root)) return;
    std::error_code ec;
    const bool own = resumed && fs::equivalent(root, resumed->root, ec);
    const std::vector<StepDir> dirs = list_step_dirs(root);
    if (!own) {
      const bool legacy = fs::exists(root / kManifestFile);
      for (const StepDir& d : dirs)
        MEMFIT_CHECK(!d.has_manifest && !legacy, "checkpoint",
                     "'{}' already holds checkpoints (newest {}); continue them with --resume {}, or write to "
                     "another --checkpoint-dir", root.string(), d.path.filename().string(), root.string());
      MEMFIT_CHECK(!legacy, "checkpoint", "'{}' holds a checkpoint of an older memfit; write to another --checkpoint-dir",
                   root.string());
    }
    const int64_t resumed_step = own ? resumed->manifest.step : -1;
    for (const StepDir& d : dirs) {
      if (d.step <= resumed_step) continue;
      const std::string name = d.path.filename().string();
      if (!d.has_manifest) {
        fs::remove_all(d.path);
        notes.push_back(fmt::format("removed {}: its save did not finish", name));
        continue;
      }
      std::string why = fmt::format("newer than the resumed {}", step_dir_name(resumed_step));
      for (const std::string& s : resumed->skipped)
        if (s.starts_with(name + ": ")) why = s.substr(name.size() + 2);
      notes.push_back(fmt::format("moved {} aside to {} ({})", name, set_aside(d.path), why));
    }
    if (own && !notes.empty()) point_latest_at(root, step_dir_name(resumed_step));
  });
  throw_unless_ok(agree(comm, o));
  return notes;
}

}  // namespace memfit
