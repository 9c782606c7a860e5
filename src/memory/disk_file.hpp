// DiskFile: the disk tier's buffer, one file per rank (`memfit-rank<R>.tier`) under a
// directory, preallocated with posix_fallocate to the planned size before the first step, so
// a run never meets ENOSPC halfway. Bytes move on a second descriptor opened with O_DIRECT
// (no page cache: the state streamed every step would otherwise fill the machine's memory
// with cached pages and be copied twice) wherever the memory address, the file offset and the
// length are multiples of 4 KiB: every offset the plan hands out on the disk tier and on the
// host tier that stages it is, so only the unaligned tail of a tensor goes through the page
// cache. Where the filesystem refuses O_DIRECT (tmpfs), everything goes through the page cache
// and describe() says so. Transfers go through io_uring in blocks, many in flight
// (memory/uring_io.hpp, BufferSite::io), or through pread/pwrite where the kernel refuses
// io_uring or MEMFIT_DISK_IO=pread asks for it; read() and write() return when every byte has
// moved either way. The high-water mark is the highest byte ever written (a file has no
// sentinel to scan cheaply).
// Invariant: the file's length equals size() from construction to destruction; the file is
// removed when the buffer is destroyed. read() and write() may be called from several threads
// at once on different ranges (the transfer engine's two workers do).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "memory/buffer_type.hpp"
#include "memory/uring_io.hpp"

namespace memfit {

inline constexpr uint64_t kDiskAlignment = 4096;

class DiskFile final : public Buffer {
 public:
  // Throws [memory] naming the path when the directory is missing or unwritable, or when the
  // filesystem has no room for `bytes`.
  DiskFile(Tier tier, uint64_t bytes, const BufferSite& site);
  ~DiskFile() override;
  DiskFile(const DiskFile&) = delete;
  DiskFile& operator=(const DiskFile&) = delete;

  Tier tier() const override { return tier_; }
  uint64_t size() const override { return size_; }
  std::byte* host_data() const override { return nullptr; }
  void write(uint64_t offset, std::span<const std::byte> bytes) override;
  void read(uint64_t offset, std::span<std::byte> bytes) const override;
  uint64_t measured_high_water() const override { return highest_written_.load(std::memory_order_acquire); }

  std::string describe() const override;

  const std::string& path() const { return path_; }
  bool direct() const { return direct_fd_ >= 0; }
  int fd() const { return fd_; }                // the page-cache descriptor (tests break it)
  int direct_fd() const { return direct_fd_; }  // the O_DIRECT one, -1 when refused
  bool uses_io_uring() const { return uring_ != nullptr && uring_->available(); }

 private:
  Tier tier_;
  uint64_t size_;
  std::string path_;
  int fd_ = -1;
  int direct_fd_ = -1;  // the same file with O_DIRECT; -1 where the filesystem refuses it
  std::string no_direct_reason_;
  std::unique_ptr<UringIo> uring_;  // null when MEMFIT_DISK_IO=pread
  std::string pread_reason_;        // why transfers use pread/pwrite, "" when they use io_uring
  std::atomic<uint64_t> highest_written_ = 0;

  // Moves bytes between `data` and the file at `offset`; throws "cannot <verb> PATH: ...".
  void transfer(IoDirection dir, uint64_t offset, std::byte* data, size_t bytes) const;
};

}  // namespace memfit
