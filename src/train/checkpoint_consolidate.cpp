// Consolidating a checkpoint into HF weights (see checkpoint_consolidate.hpp).
#include "train/checkpoint_consolidate.hpp"

#include <sys/resource.h>

#include <algorithm>
#include <filesystem>
#include <map>

#include <fmt/format.h>

#include "core/error.hpp"
#include "train/adapter_files.hpp"
#include "train/checkpoint_dir.hpp"
#include "train/checkpoint_files.hpp"
#include "train/checkpoint_manifest.hpp"
#include "train/checkpoint_reshard.hpp"
#include "train/run_config.hpp"
#include "train/trainer.hpp"
#include "train/weights.hpp"

namespace memfit {

namespace fs = std::filesystem;

namespace {

struct Found {
  fs::path dir;
  CheckpointManifest manifest;
  std::vector<std::string> skipped;
};

CheckpointManifest read_manifest(const fs::path& dir) {
  const fs::path path = dir / kManifestFile;
  MEMFIT_CHECK(fs::exists(path), "checkpoint", "{}: missing (its save did not finish)", path.string());
  try {
    return parse_checkpoint_manifest(read_bounded_file(path, kMaxManifestBytes));
  } catch (const Error& e) {
    throw Error("checkpoint", fmt::format("{}: {}", path.string(), std::string(e.what()).substr(e.piece().size() + 3)));
  }
}

// A step directory as named, or a root's newest step directory whose manifest parses.
Found find_checkpoint(const std::string& name) {
  const fs::path p = fs::path(name).lexically_normal();
  if (fs::exists(p / kManifestFile) || parse_step_dir_name(p.filename().string())) return {p, read_manifest(p), {}};
  MEMFIT_CHECK(fs::is_directory(p), "checkpoint", "'{}' is neither a checkpoint nor a directory of checkpoints", name);
  Found found;
  for (const StepDir& d : list_step_dirs(p)) {
    try {
      found.manifest = read_manifest(d.path);
      found.dir = d.path;
      return found;
    } catch (const Error& e) {
      found.skipped.push_back(fmt::format("{}: {}", d.path.filename().string(), e.what()));
    }
  }
  std::string why;
  for (const std::string& s : found.skipped) why += "; " + s;
  throw Error("checkpoint", fmt::format("'{}' holds no checkpoint with a valid manifest{}", name, why));
}

ModelSpec spec_of(const CheckpointManifest& m) {
  ModelSpec spec;
  try {
    spec = resolve_model(m.model);
  } catch (const Error& e) {
    throw Error("checkpoint", fmt::format("the checkpoint's model '{}' cannot be resolved here: {}", m.model, e.what()));
  }
  const nlohmann::json& saved = m.model_spec;
  nlohmann::json ours = model_json(spec, saved.value("parameters", int64_t(0)));
  nlohmann::json theirs = saved;
  ours.erase("name"), theirs.erase("name");
  MEMFIT_CHECK(ours == theirs, "checkpoint", "the checkpoint's model '{}' was {} when it was saved; it is now {}",
               m.model, theirs.dump(), ours.dump());
  return spec;
}

int64_t peak_rss_bytes() {
  struct rusage u {};
  getrusage(RUSAGE_SELF, &u);
  return int64_t(u.ru_maxrss) * 1024;
}

}  // namespace

Consolidated consolidate_checkpoint(const std::string& checkpoint, const std::string& out_dir, uint64_t max_shard,
                                   std::ostream& out) {
  const Found found = find_checkpoint(checkpoint);
  const CheckpointManifest& m = found.manifest;
  for (const std::string& s : found.skipped) out << "consolidate: skipped " << s << "\n";
  MEMFIT_CHECK(m.has_layout(), "checkpoint", "{}: was written by an older memfit, without a global layout; resume it "
               "with this memfit and let it save again", found.dir.string());
  const ModelSpec spec = spec_of(m);
  std::map<std::string, const SavedTensor*> by_name;
  std::vector<SavedParam> params;
  std::vector<const SavedTensor*> source;  // per parameter: its master, else its value
  for (const SavedTensor& t : m.tensors) {
    by_name[t.name] = &t;
    MEMFIT_CHECK(t.role == "value" || t.role == "master" || t.role.starts_with("adamw"), "checkpoint",
                 "holds '{}' as {} tensors: consolidate writes plain float weights (quantised bases are not)", t.param,
                 t.role);
    MEMFIT_CHECK(!is_lora_adapter(t.param), "checkpoint", "holds the LoRA adapter '{}': a LoRA run's --save writes "
                 "the adapter, and memfit merge-lora merges it", t.param);
  }
  for (const SavedTensor& t : m.tensors)
    if (t.role == "value") {
      params.push_back({t.param, t.shape});
      auto master = by_name.find("master." + t.param);
      source.push_back(master != by_name.end() ? master->second : &t);
    }

  TensorStaging staging;
  const int64_t rss_before = peak_rss_bytes();
  std::vector<float> whole;  // the one parameter held at a time
  size_t held = params.size();
  int64_t largest = 0;
  std::string largest_name;
  save_weights_from(out_dir, params, spec, staging, [&](size_t i, int64_t first, std::span<float> values) {
    if (held != i) {
      const SavedTensor& t = *source[i];
      whole.resize(size_t(t.shape.numel()));
      read_saved_f32(found.dir, m, t, 0, whole, staging.raw());
      held = i;
      if (t.shape.numel() > largest) largest = t.shape.numel(), largest_name = t.name;
    }
    std::copy_n(whole.begin() + first, values.size(), values.begin());
  }, max_shard);
  Consolidated c{found.dir.string(), int64_t(params.size()), largest_name, largest * 4, rss_before, peak_rss_bytes()};
  out << fmt::format("consolidated {} ({} ranks, ZeRO stage {}, step {}): {} parameters from {} into {}\n", c.dir,
                     m.world_size, m.zero_stage, m.step, c.parameters,
                     source.empty() || source[0]->role == "value" ? "their values" : "the fp32 masters", out_dir);
  out << fmt::format("memory: peak RSS {:.2f} MiB ({:.2f} MiB before the first tensor); largest tensor '{}' {:.2f} MiB "
                     "as fp32\n", double(c.peak_rss_bytes) / (1 << 20), double(c.rss_before_bytes) / (1 << 20),
                     c.largest_tensor, double(c.largest_bytes) / (1 << 20));
  return c;
}

}  // namespace memfit
