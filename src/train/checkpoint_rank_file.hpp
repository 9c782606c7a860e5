// One rank's checkpoint file, rank-R-of-W.bin: every persistent tensor of its program that
// carries model state (parameters, master weights, optimizer state; under ZeRO its shards),
// in program order. Layout:
//   "MEMFITCK" | u64 LE header length | header JSON | tensor bytes back to back | u64 LE XXH3
// The header is {"format", "rank", "world_size", "step", "tensors": [{name, dtype, bytes}]};
// the trailing XXH3 covers everything before it (magic, length, header and data).
// Gradients are not saved: the first micro-step of every step overwrites them.
//
// Invariant: a file passes validation only when its size is exactly what its header
// describes (nothing truncated, nothing trailing), its header lists exactly this program's
// checkpointed tensors in order with their dtypes and sizes (names unique), it is this
// rank's file of this step, and its checksum equals both its trailer and its manifest entry.
#pragma once

#include <cstdint>
#include <filesystem>
#include <vector>

#include "runtime/executor.hpp"
#include "train/checkpoint_manifest.hpp"
#include "train/tensor_staging.hpp"

namespace memfit {

struct RankFileIdentity {
  int rank = 0;
  int world_size = 1;
  int64_t step = 0;
};

// The tensors a checkpoint holds, in program order.
std::vector<TensorId> checkpointed_tensors(const Program& program);

struct WrittenRankFile {
  RankFileEntry entry;                 // size, checksum, and a checksum per chunk of kChunkBytes
  std::vector<uint64_t> root_offsets;  // byte of the file where each checkpointed tensor starts
};

// The chunk over which a range read is verified: the staging's raw region, so a chunk is read,
// checked, and only then copied into the executor.
inline constexpr uint64_t kRankFileChunkBytes = TensorStaging::kElements * sizeof(float);

// Writes and fsyncs the file (and its directory entry). Returns its size and checksums.
// Throws [checkpoint] naming the file when it cannot be written.
WrittenRankFile write_rank_file(const std::filesystem::path& path, const Executor& ex, TensorStaging& staging,
                                const RankFileIdentity& who);

// Reads the whole file without touching any tensor and throws [checkpoint] "PATH: ..." unless
// it is valid for this program, this rank and step, and its manifest entry.
void validate_rank_file(const std::filesystem::path& path, const Program& program, const RankFileIdentity& who,
                        const RankFileEntry& entry);

// Whether the file's header lists this program's checkpointed tensors, by name and size (the
// same layout), reading only the header's chunks. A file that cannot be read or parsed, or
// whose header chunks fail the manifest entry's checksums, counts as listing them, so that
// validate_rank_file reports what is wrong with it. An intact header with another list means
// another layout of the same world and stage (ZeRO's alignment differs under qwZ): the
// checkpoint is then read by byte ranges.
bool rank_file_lists_program_tensors(const std::filesystem::path& path, const Program& program,
                                     const RankFileEntry& entry);

// Reads the tensors into the executor, checking the layout and checksum again (the file may
// have changed since it was validated). Throws like validate_rank_file; the tensors are then
// partly overwritten.
void read_rank_file(const std::filesystem::path& path, Executor& ex, TensorStaging& staging,
                    const RankFileIdentity& who,
                    const RankFileEntry& entry);

// The checksum in a file's last 8 bytes and its size (rank 0 checks every rank's file
// against what that rank reported before the manifest names it). Throws [checkpoint].
RankFileEntry rank_file_trailer(const std::filesystem::path& path);

}  // namespace memfit
