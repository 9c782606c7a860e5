// check_deepspeed_bounds (train/deepspeed_config.hpp), apart from the config reader so that the
// reader builds without the program (the fuzz build compiles only the readers).
#include <map>

#include "graph/program.hpp"
#include "train/config_values.hpp"
#include "train/deepspeed_config.hpp"

namespace memfit {

void check_deepspeed_bounds(const RunConfig& c, const Program& p) {
  // memfit's ZeRO buckets: the parameters of one layer (graph/zero.hpp), layer -1 included.
  std::map<int, int64_t> per_layer;
  for (const ParamEntry& e : p.params()) per_layer[p.tensor(e.storage.front().id).layer] += p.param_numel(e);
  int64_t largest = 0;
  for (const auto& [layer, n] : per_layer) largest = std::max(largest, n);
  const RunConfig::ZeroBounds& b = c.zero_bounds;
  const struct {
    const char* key;
    int64_t bound, needed;
  } checks[] = {{"reduce_bucket_size", b.reduce_bucket, largest},
                {"allgather_bucket_size", b.allgather_bucket, largest},
                {"stage3_prefetch_bucket_size", b.prefetch_bucket, largest},
                {"stage3_max_live_parameters", b.max_live_parameters, 2 * largest},
                {"sub_group_size", b.sub_group, largest}};
  for (const auto& check : checks)
    refuse_unless(check.bound == 0 || check.bound >= check.needed, std::string("zero_optimization.") + check.key,
                  fmt::format("memfit's ZeRO buckets hold whole layers (the largest: {} elements), so it needs at least "
                              "{}, not {}", largest, check.needed, check.bound));
}

}  // namespace memfit
