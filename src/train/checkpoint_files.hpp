// The file layer under training checkpoints: durable writes (write, fsync the file, fsync
// the directory that names it), atomic replacement of a small file (temporary name, fsync,
// rename, fsync the parent), XXH3-64 checksums, and bounded reads. The invariant the
// checkpoint protocol builds on: when one of these functions returns, what it wrote is on
// stable storage under its final name, or it threw and the final name still holds what it
// held before.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>

namespace memfit {

// XXH3-64 (libxxhash) over a stream of parts: the checksum of every checkpoint file.
class Checksum {
 public:
  Checksum();
  ~Checksum();
  Checksum(const Checksum&) = delete;
  Checksum& operator=(const Checksum&) = delete;
  void update(const void* data, size_t bytes);
  uint64_t digest() const;
  void reset();  // back to the checksum of nothing

 private:
  void* state_;  // XXH3_state_t, kept out of this header
};

uint64_t checksum_of(std::string_view bytes);
std::string checksum_hex(uint64_t h);          // 16 lowercase hex digits
bool parse_checksum_hex(std::string_view s, uint64_t& h);  // exactly 16 hex digits

// An open file descriptor that writes everything or throws [checkpoint] naming the file.
class DurableFile {
 public:
  explicit DurableFile(const std::filesystem::path& path);  // creates or truncates
  ~DurableFile();
  DurableFile(const DurableFile&) = delete;
  DurableFile& operator=(const DurableFile&) = delete;
  void write(const void* data, size_t bytes);
  // fsync, close, then fsync the directory so that the name survives a crash too.
  void commit();

 private:
  std::filesystem::path path_;
  int fd_ = -1;
};

void fsync_directory(const std::filesystem::path& dir);  // throws [checkpoint]

// Writes `text` to path.tmp, fsyncs it, renames it over `path` and fsyncs the parent.
void replace_file_atomically(const std::filesystem::path& path, std::string_view text);

// The whole file when it holds at most max_bytes; throws [checkpoint] otherwise.
std::string read_bounded_file(const std::filesystem::path& path, uint64_t max_bytes);

}  // namespace memfit
