// Read-only memory maps of whole files, and atomic file replacement. Shared by the io readers
// and writers; every failure is a memfit::Error carrying the caller's piece and the file path.
//
// Invariant of MappedFile: data() points at size() readable bytes for the handle's lifetime
// (nullptr when the file is empty); the mapping is released exactly once, by whichever handle
// owns it last (the type is move-only).
// Invariant of AtomicFileWriter: the destination path holds either its old content or the
// complete new content, never a mix; the temporary path + ".tmp" is removed on any failure.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace memfit {

class MappedFile {
 public:
  MappedFile() = default;
  // Maps a regular file read-only. Throws [piece] naming the path when it is missing, a
  // directory, not a regular file, or cannot be read.
  static MappedFile open(const std::string& path, std::string_view piece);

  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile();

  const std::byte* data() const { return data_; }
  uint64_t size() const { return size_; }
  const std::string& path() const { return path_; }

  // Gives back the resident pages wholly inside bytes [offset, offset + count) once the caller
  // has copied them out: they stop counting in the process's RSS, and a later read of them
  // faults them in again from the file (the mapping is private and never written).
  void drop_pages(uint64_t offset, uint64_t count) const noexcept;

 private:
  void release() noexcept;

  const std::byte* data_ = nullptr;
  uint64_t size_ = 0;
  std::string path_;
};

// Writes a file so that a crash or error at any point leaves the destination as it was:
// bytes go to path + ".tmp", commit() fsyncs it, renames it over path and fsyncs the
// directory. Destroying the writer without commit() removes the temporary file.
class AtomicFileWriter {
 public:
  AtomicFileWriter(std::string path, std::string_view piece);  // creates path + ".tmp"
  AtomicFileWriter(const AtomicFileWriter&) = delete;
  AtomicFileWriter& operator=(const AtomicFileWriter&) = delete;
  ~AtomicFileWriter();

  void write(const void* bytes, uint64_t count);
  void commit();

 private:
  std::string path_, temp_path_, piece_;
  int fd_ = -1;
  bool committed_ = false;
};

}  // namespace memfit
