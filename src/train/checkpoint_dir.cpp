// Step directories, the latest pointer and retention (see checkpoint_dir.hpp).
#include "train/checkpoint_dir.hpp"

#include <algorithm>
#include <charconv>

#include "core/error.hpp"
#include "train/checkpoint_files.hpp"

namespace memfit {

namespace fs = std::filesystem;

std::string step_dir_name(int64_t step) { return fmt::format("step-{:06d}", step); }

std::optional<int64_t> parse_step_dir_name(std::string_view name) {
  if (!name.starts_with("step-")) return std::nullopt;
  const std::string_view digits = name.substr(5);
  int64_t step = 0;
  const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), step);
  if (ec != std::errc() || end != digits.data() + digits.size() || step < 0 || step_dir_name(step) != name)
    return std::nullopt;
  return step;
}

std::vector<StepDir> list_step_dirs(const fs::path& root) {
  std::vector<StepDir> dirs;
  std::error_code ec;
  for (fs::directory_iterator it(root, ec), end; !ec && it != end; it.increment(ec)) {
    const std::optional<int64_t> step = parse_step_dir_name(it->path().filename().string());
    if (!step || !it->is_directory()) continue;
    dirs.push_back(StepDir{*step, it->path(), fs::exists(it->path() / kManifestFile)});
  }
  MEMFIT_CHECK(!ec, "checkpoint", "cannot list the checkpoint directory '{}': {}", root.string(), ec.message());
  std::sort(dirs.begin(), dirs.end(), [](const StepDir& a, const StepDir& b) { return a.step > b.step; });
  return dirs;
}

void point_latest_at(const fs::path& root, const std::string& name) {
  replace_file_atomically(root / kLatestFile, name + "\n");
}

std::optional<std::string> read_latest(const fs::path& root, std::string& problem) {
  const fs::path path = root / kLatestFile;
  if (!fs::exists(path)) return std::nullopt;
  try {
    std::string text = read_bounded_file(path, 256);
    while (!text.empty() && (text.back() == '\n' || text.back() == '\r')) text.pop_back();
    if (!parse_step_dir_name(text)) {
      problem = fmt::format("{} does not name a step directory", path.string());
      return std::nullopt;
    }
    if (!fs::is_directory(root / text)) {
      problem = fmt::format("{} names {}, which does not exist", path.string(), text);
      return std::nullopt;
    }
    return text;
  } catch (const Error& e) {
    problem = e.what();
    return std::nullopt;
  }
}

std::string set_aside(const fs::path& dir) {
  for (int k = 1;; ++k) {
    const fs::path to = dir.string() + (k == 1 ? std::string(".set-aside") : fmt::format(".set-aside-{}", k));
    if (fs::exists(to)) continue;
    std::error_code ec;
    fs::rename(dir, to, ec);
    MEMFIT_CHECK(!ec, "checkpoint", "cannot move '{}' aside to '{}': {}", dir.string(), to.string(), ec.message());
    fsync_directory(dir.parent_path());
    return to.filename().string();
  }
}

std::vector<std::string> remove_old_checkpoints(const fs::path& root, int64_t current, int keep) {
  std::vector<std::string> removed;
  int kept = 0;
  for (const StepDir& d : list_step_dirs(root)) {  // newest first
    if (d.step > current) continue;
    if (d.has_manifest && kept < keep) {
      ++kept;
      continue;
    }
    if (d.step == current) continue;  // never the one latest names
    std::error_code ec;
    fs::remove_all(d.path, ec);
    MEMFIT_CHECK(!ec, "checkpoint", "cannot remove the old checkpoint '{}': {}", d.path.string(), ec.message());
    removed.push_back(d.path.filename().string());
  }
  if (!removed.empty()) fsync_directory(root);
  return removed;
}

}  // namespace memfit
