// The checkpoint root: one directory per save (step-000123/), a `latest` file naming the
// newest complete one, and the housekeeping around them. Everything here runs on one
// process (rank 0 of a save); train/checkpoint.cpp makes it collective.
//
// Invariant: a step directory counts as complete only when it holds manifest.json (written
// after every rank file was complete and checked); `latest` is only ever moved to a
// complete one, atomically, and older ones are removed only after it moved.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace memfit {

inline constexpr const char* kLatestFile = "latest";
inline constexpr const char* kManifestFile = "manifest.json";

std::string step_dir_name(int64_t step);  // step-000123 (wider past 999999)
// The step of a canonical step directory name; nullopt for anything else (step-12, step-000012.x).
std::optional<int64_t> parse_step_dir_name(std::string_view name);

struct StepDir {
  int64_t step = 0;
  std::filesystem::path path;
  bool has_manifest = false;  // false: a save that did not finish
};

// The step directories of `root`, newest first. Throws [checkpoint] when root cannot be read.
std::vector<StepDir> list_step_dirs(const std::filesystem::path& root);

// Atomically points root/latest at the step directory `name` (temp file, fsync, rename, fsync).
void point_latest_at(const std::filesystem::path& root, const std::string& name);
// The directory root/latest names; nullopt when absent. Sets `problem` when it is unreadable
// or names no canonical step directory.
std::optional<std::string> read_latest(const std::filesystem::path& root, std::string& problem);

// Renames dir to the first free "NAME.set-aside", "NAME.set-aside-2", ...; returns the new name.
std::string set_aside(const std::filesystem::path& dir);

// After latest moved to step `current`: keeps the `keep` newest complete directories up to
// it, removes older complete ones and any unfinished one older than it. Returns the names
// removed. Never touches directories newer than `current`.
std::vector<std::string> remove_old_checkpoints(const std::filesystem::path& root, int64_t current, int keep);

}  // namespace memfit
