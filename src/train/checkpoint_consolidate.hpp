// `memfit consolidate`: the HF weights of a training checkpoint of any layout (world size,
// ZeRO stage, offload), as `--save` writes them: OUT/model.safetensors (fp32, sharded above
// max_shard_bytes with an index) and OUT/config.json. Each parameter's fp32 values come from
// its master when the run kept one (mixed precision), else from its value widened, rebuilt
// whole from the shards the manifest lists (train/checkpoint_layout.hpp), one parameter at a
// time: peak memory is about the largest tensor in fp32 plus the staging, whatever the
// model's size. Every chunk read is verified against the manifest's checksums. No MPI, no
// program, no executor.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>

namespace memfit {

struct Consolidated {
  std::string dir;  // the step directory read
  int64_t parameters = 0;
  std::string largest_tensor;
  int64_t largest_bytes = 0;  // as fp32
  int64_t rss_before_bytes = 0, peak_rss_bytes = 0;  // the process's peak RSS before the first tensor and at the end
};

// `checkpoint` is a step directory, or a checkpoint root (its newest step directory whose
// manifest parses; the ones skipped are logged). Throws [checkpoint] for a checkpoint without
// a global layout (an older memfit), quantised or LoRA tensors, or a model that no longer
// resolves to what was saved; damaged files as resuming reports them.
Consolidated consolidate_checkpoint(const std::string& checkpoint, const std::string& out_dir, uint64_t max_shard_bytes,
                                    std::ostream& log);

}  // namespace memfit
