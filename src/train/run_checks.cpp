#include "train/run_checks.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <vector>

#include "core/error.hpp"
#include "core/half.hpp"
#include "graph/policy.hpp"
#include "graph/training_program.hpp"

namespace memfit {

namespace fs = std::filesystem;

namespace {

// Creates and removes a file in `dir`: the only test of writability that holds for every
// reason a write can fail (permissions, a read-only mount, ACLs, root on a read-only fs).
void probe_directory(const std::string& flag, const std::string& path, const fs::path& dir) {
  std::string name = (dir / ".memfit-probe-XXXXXX").string();
  std::vector<char> buf(name.begin(), name.end());
  buf.push_back('\0');
  const int fd = mkstemp(buf.data());
  MEMFIT_CHECK(fd >= 0, "train", "{} '{}' cannot be written: cannot create a file in '{}' ({})", flag, path,
               dir.string(), std::strerror(errno));
  close(fd);
  unlink(buf.data());
}

// The directory a save to `target` writes into: the nearest existing ancestor when the save
// creates directories on the way (make_dirs), else the parent, which must exist.
void check_writable(const std::string& flag, const std::string& path, bool is_directory_target, bool make_dirs) {
  if (path.empty()) return;
  std::error_code ec;
  fs::path dir = is_directory_target ? fs::path(path) : fs::path(path).parent_path();
  if (dir.empty()) dir = ".";
  if (make_dirs)
    while (!fs::exists(dir, ec) && dir.parent_path() != dir)  // a relative name climbs to "."
      dir = dir.has_parent_path() ? dir.parent_path() : fs::path(".");
  MEMFIT_CHECK(fs::exists(dir, ec), "train", "{} '{}' cannot be written: the directory '{}' does not exist", flag,
               path, dir.string());
  MEMFIT_CHECK(fs::is_directory(dir, ec), "train", "{} '{}' cannot be written: '{}' is not a directory", flag, path,
               dir.string());
  probe_directory(flag, path, dir);
}

bool ends_with(const std::string& s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::optional<NonFiniteTensor> scan_tensor(const Executor& ex, TensorId id, bool optimizer_state,
                                           TensorStaging& staging) {
  if (id == kNoTensor) return std::nullopt;
  const TensorDesc& t = ex.program().tensor(id);
  if (t.lifetime != Lifetime::persistent || !dtype_is_float(t.dtype)) return std::nullopt;  // 8-bit codes
  std::optional<NonFiniteTensor> found;
  visit_float_type(t.dtype, [&](auto tag) {
    using T = decltype(tag);
    const std::span<T> chunk(reinterpret_cast<T*>(staging.raw().data()), staging.raw().size() / sizeof(T));
    for (int64_t first = 0; first < t.numel() && !found; first += int64_t(chunk.size())) {
      const std::span<T> x = chunk.first(size_t(std::min<int64_t>(int64_t(chunk.size()), t.numel() - first)));
      ex.read_as<T>(id, first, x);
      for (size_t i = 0; i < x.size(); ++i)
        if (non_finite(x[i])) {
          found = NonFiniteTensor{t.name, optimizer_state, first + int64_t(i), double(widen(x[i]))};
          return;
        }
    }
  });
  return found;
}

}  // namespace

void check_output_paths(const RunConfig& c, int rank) {
  std::error_code ec;
  MEMFIT_CHECK(c.save.empty() || !c.policy.quantize_base.enabled() || c.policy.lora.enabled(), "train",
               "--save with --quantize-base {} and no LoRA: the quantised base weights are not saved as HF weights "
               "(save the trainable ones with --checkpoint-dir, or train LoRA adapters)",
               base_quant_name(c.policy.quantize_base.kind));
  if (rank == 0) {
    MEMFIT_CHECK(c.report_json.empty() || !fs::is_directory(c.report_json, ec), "train",
                 "--report-json '{}' is a directory; name the report file", c.report_json);
    check_writable("--report-json", c.report_json, false, false);
    // save_weights: a .safetensors file into an existing directory, else a directory it creates.
    check_writable("--save", c.save, !ends_with(c.save, ".safetensors"), !ends_with(c.save, ".safetensors"));
    MEMFIT_CHECK(c.save.empty() || !c.policy.lora.enabled() || !ends_with(c.save, ".safetensors"), "train",
                 "--save '{}': a LoRA run saves a PEFT adapter directory (adapter_config.json + "
                 "adapter_model.safetensors); name a directory", c.save);
  }
  if (!c.checkpoint_dir.empty()) {
    MEMFIT_CHECK(!fs::exists(c.checkpoint_dir, ec) || fs::is_directory(c.checkpoint_dir, ec), "train",
                 "--checkpoint-dir '{}' is not a directory", c.checkpoint_dir);
    check_writable("--checkpoint-dir", c.checkpoint_dir, true, true);
  }
}

void check_split_tokens(const TokenData& data, int64_t begin, int64_t end, int64_t vocab, const std::string& split) {
  constexpr int64_t kChunk = 1 << 16;
  std::vector<int32_t> chunk(size_t(std::min<int64_t>(kChunk, std::max<int64_t>(end - begin, 0))));
  for (int64_t at = begin; at < end; at += kChunk) {
    const int64_t n = std::min(kChunk, end - at);
    data.copy(at, n, chunk.data());
    for (int64_t i = 0; i < n; ++i)
      MEMFIT_CHECK(chunk[size_t(i)] >= 0 && chunk[size_t(i)] < vocab, "data",
                   "token {} at position {} of {} is outside the model's vocabulary of {} (the {} split, checked "
                   "before step 1)",
                   chunk[size_t(i)], at + i, data.description(), vocab, split);
  }
}

std::string NonFiniteTensor::describe() const {
  return fmt::format("{} '{}' (element {} is {})", optimizer_state ? "optimizer state" : "parameter", name, element,
                     value);
}

StateScan scan_training_state(const Executor& ex, TensorStaging& staging) {
  StateScan scan;
  for (const ParamEntry& p : ex.program().params()) {
    for (TensorId id : {p.value_shard != kNoTensor ? p.value_shard : p.value, p.master})
      if (!scan.weight) scan.weight = scan_tensor(ex, id, false, staging);
    for (TensorId id : p.state)
      if (!scan.optimizer_state) scan.optimizer_state = scan_tensor(ex, id, true, staging);
    if (scan.weight && scan.optimizer_state) break;
  }
  return scan;
}

namespace {

// The cause of a non-finite state after updates, as far as the state tells it.
std::string cause_after_updates(const StateScan& scan, const RunConfig& c) {
  if (scan.optimizer_state)
    return fmt::format("{} became non-finite: the gradients were not finite (their source is upstream of the "
                       "optimizer: the loss, the data or the precision)",
                       scan.optimizer_state->describe());
  const AdamWConfig& a = c.policy.adamw;
  if (!(a.beta1 >= 0 && a.beta1 < 1 && a.beta2 >= 0 && a.beta2 < 1 && a.eps > 0))  // bias correction 1 - beta^t = 0
    return fmt::format("{} became non-finite while every optimizer state stayed finite: AdamW's settings (beta1 {}, "
                       "beta2 {}, eps {}) divide by zero; betas must lie in [0, 1) and eps above 0",
                       scan.weight->describe(), a.beta1, a.beta2, a.eps);
  return fmt::format("{} became non-finite while every optimizer state stayed finite: the update step, --lr {} "
                     "times AdamW's normalised direction, overflowed; lower --lr",
                     scan.weight->describe(), c.lr);
}

}  // namespace

void require_finite_state(const Executor& ex, const RunConfig& c, int64_t step, TensorStaging& staging,
                          const std::string& what) {
  const StateScan scan = scan_training_state(ex, staging);
  if (scan.finite()) return;
  throw Error("train", fmt::format("after step {}: {}; {} not written", step, cause_after_updates(scan, c), what));
}

void require_finite_start(const Executor& ex, const RunConfig& c, TensorStaging& staging) {
  const StateScan scan = scan_training_state(ex, staging);
  if (scan.finite()) return;
  const std::string source = !c.resume.empty() ? fmt::format("the checkpoint resumed from '{}'", c.resume)
                             : !c.load.empty() ? fmt::format("--load '{}'", c.load)
                                               : "the initialisation";
  throw Error("train", fmt::format("before step 1, {} from {} is not finite: nothing trained",
                                   (scan.weight ? scan.weight : scan.optimizer_state)->describe(), source));
}

UpdateWatch::UpdateWatch(const Executor& ex, TensorStaging& staging) : ex_(ex), staging_(staging) {
  const Program& p = ex.program();
  if (const Section* opt = p.find_section(SectionKind::optimizer); opt && opt->end > opt->begin) optimizer_begin_ = opt->begin;
  loss_ = p.find_tensor(kLoss);
}

void UpdateWatch::before_op(int op, const StepContext&) {
  if (op != optimizer_begin_ || loss_ == kNoTensor || scan_ || std::isfinite(ex_.read_scalar<float>(loss_))) return;
  scan_ = scan_training_state(ex_, staging_);  // the error path: the run stops after this step
}

std::string explain_non_finite_loss(const Executor& ex, const RunConfig& c, int64_t updates_before,
                                    const std::optional<StateScan>& before_update, TensorStaging& staging) {
  if (updates_before == 0)
    return fmt::format("before any update of this run, with every weight and optimizer state finite (checked "
                       "before step 1): the input or the weights' magnitudes overflow the forward in {}; the "
                       "learning rate is not the cause",
                       precision_name(c.policy.precision));
  if (!before_update) {  // no optimizer section to watch (--optimizer-in-backward)
    const StateScan now = scan_training_state(ex, staging);
    if (now.finite()) return fmt::format("after {} update(s); every weight is finite", updates_before);
    return fmt::format("after {} update(s); after this step's update {} is not finite", updates_before,
                       (now.weight ? now.weight : now.optimizer_state)->describe());
  }
  if (!before_update->finite()) return cause_after_updates(*before_update, c);
  return fmt::format("after {} update(s), with every weight and optimizer state finite: the weights grew until the "
                     "forward overflowed; lower --lr (now {})",
                     updates_before, c.lr);
}

}  // namespace memfit
