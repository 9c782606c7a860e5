// A model's weights as HF publishes them: one .safetensors file, a directory holding
// model.safetensors, or model.safetensors.index.json with the shards its weight_map names; and
// the writer that produces the same layouts (transformers' save_pretrained with max_shard_size).
//
// Invariant of SafetensorsShards: once constructed, every shard has been opened and validated
// (io/safetensors.hpp), every tensor the index names lies in the shard it names, every tensor of
// every shard is named by the index for that shard, and no tensor name occurs twice anywhere.
// Any violation throws [safetensors] naming the file. Shards stay mapped, not read: a tensor's
// pages become resident only when copied, and release() gives them back, so loading a model
// holds about one tensor in RSS at a time.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "io/safetensors.hpp"

namespace memfit {

inline constexpr std::string_view kSafetensorsIndexName = "model.safetensors.index.json";
inline constexpr std::string_view kSingleSafetensorsName = "model.safetensors";

class SafetensorsShards {
 public:
  // path: a .safetensors file, a .safetensors.index.json file, or a directory holding either
  // model.safetensors or model.safetensors.index.json (the single file wins when both exist, as
  // transformers prefers it).
  explicit SafetensorsShards(const std::string& path);

  struct Located {
    const SafetensorsReader* shard = nullptr;
    const SafetensorsEntry* entry = nullptr;
  };
  // Every tensor, shard by shard, each shard's by offset.
  const std::vector<Located>& tensors() const { return tensors_; }
  const Located* find(std::string_view name) const;  // nullptr when absent
  // What error messages name: the file, or the index file of a sharded checkpoint.
  const std::string& description() const { return description_; }
  size_t shard_count() const { return shards_.size(); }
  // Drops the resident pages of a tensor whose bytes the caller has copied out.
  void release(const Located& tensor) const;

 private:
  void open_index(const std::string& index_path);

  std::vector<std::unique_ptr<SafetensorsReader>> shards_;
  std::vector<Located> tensors_;
  std::map<std::string, size_t, std::less<>> by_name_;  // -> position in tensors_
  std::string description_;
};

// "5GB" (10^9 bytes, as transformers reads it), "500MB", "2GiB" (2^30), "100KB", "4096" (bytes).
// Throws [safetensors] on anything else or on zero.
uint64_t parse_shard_size(std::string_view text);

// Writes tensors into `directory` as transformers does: one model.safetensors when they fit in
// max_shard_bytes, else model-00001-of-0000N.safetensors shards (a tensor larger than the limit
// gets a shard of its own; otherwise a shard is closed when the next tensor would overflow it)
// plus model.safetensors.index.json ({"metadata": {"total_size"}, "weight_map"}). Each file is
// written atomically, the index last; files of an earlier save that the new one does not use
// (stale shards, a stale single file or index) are removed after it, so a reader never sees a
// mix. Each tensor's bytes come from its `data` or its `produce` (write_safetensors), so a
// model of any size is written through a bounded buffer. Returns the files written.
std::vector<std::string> write_safetensors_shards(const std::string& directory,
                                                  std::span<const SafetensorsTensor> tensors, uint64_t max_shard_bytes,
                                                  const std::map<std::string, std::string>& metadata = {});

}  // namespace memfit
