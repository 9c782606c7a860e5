#include "train/master_weights.hpp"

#include <algorithm>

#include "core/error.hpp"

namespace memfit {

void require_float_values(const ParamEntry& e) {
  MEMFIT_CHECK(e.plain_storage(), "train", "parameter '{}' is stored as {} tensors ({} first): its values cannot be "
               "initialised, loaded or saved as floats yet", e.name, e.storage.size(),
               e.storage.empty() ? "none" : param_role_name(e.storage[0].role));
}

void store_parameter_range(Executor& ex, const ParamEntry& e, int64_t first, std::span<const float> values,
                           TensorStaging& staging) {
  require_float_values(e);
  const Program& p = ex.program();
  const int64_t end = first + int64_t(values.size());
  // The part of [first, end) inside this rank's piece [shard_offset, shard_offset + shard_numel).
  const int64_t a = std::max(first, e.shard_offset), b = std::min(end, e.shard_offset + e.shard_numel);
  const auto piece = [&] { return values.subspan(size_t(a - first), size_t(b - a)); };
  if (e.master != kNoTensor) {
    if (e.whole_state()) ex.write_as<float>(e.master, first, values);
    else if (a < b) ex.write_as<float>(e.master, a - e.shard_offset, piece());
  }
  if (e.value_shard != kNoTensor) {  // ZeRO-3: only this rank's piece persists
    if (a < b) write_fp32(ex, e.value_shard, a - e.shard_offset, piece(), staging.raw());
    return;
  }
  if (e.shard_numel == 0 && p.tensor(e.value).is_view() &&
      p.tensor(p.root_of(e.value)).category == Category::communication)
    return;  // ZeRO-3 and this rank holds no piece of it
  write_fp32(ex, e.value, first, values, staging.raw());
}

void load_parameter_range(const Executor& ex, const ParamEntry& e, int64_t first, std::span<float> out,
                          TensorStaging& staging) {
  require_float_values(e);
  const Program& p = ex.program();
  MEMFIT_CHECK(p.tensor(p.root_of(e.value)).category != Category::communication, "train",
               "parameter '{}' is sharded by ZeRO-3: whole weights cannot be read or saved yet (use --checkpoint-dir)",
               e.name);
  if (e.master != kNoTensor && e.whole_state()) return ex.read_as<float>(e.master, first, out);
  read_fp32(ex, e.value, first, out, staging.raw());
}

}  // namespace memfit
