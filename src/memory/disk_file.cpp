#include "memory/disk_file.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string_view>

#include "core/bytes.hpp"
#include "core/error.hpp"

namespace memfit {

namespace {

void check_range(const DiskFile& f, uint64_t offset, size_t bytes, const char* verb) {
  MEMFIT_CHECK(offset <= f.size() && bytes <= f.size() - offset, "memory", "{} of {} bytes at {} outside {} ({} bytes)",
               verb, bytes, offset, f.path(), f.size());
}

// The engine's two workers (one per direction) and a synchronous transfer on the compute
// thread may move bytes at once; a caller that finds every ring held uses pread/pwrite.
constexpr int kRings = 4;

// MEMFIT_DISK_IO picks how transfers move: io_uring (the default) or pread (pread/pwrite,
// for tests of that path and for comparison).
bool pread_forced() {
  const char* env = std::getenv("MEMFIT_DISK_IO");
  const std::string_view how = env ? env : "";
  MEMFIT_CHECK(how.empty() || how == "io_uring" || how == "pread", "memory",
               "MEMFIT_DISK_IO must be io_uring or pread, not '{}'", how);
  return how == "pread";
}

}  // namespace

DiskFile::DiskFile(Tier tier, uint64_t bytes, const BufferSite& site) : tier_(tier), size_(bytes) {
  MEMFIT_CHECK(!site.directory.empty(), "memory", "the {} tier needs a directory for its file (--offload-dir)",
               tier_name(tier));
  path_ = fmt::format("{}/memfit-rank{}.tier", site.directory, site.rank);
  if (pread_forced()) {
    pread_reason_ = "MEMFIT_DISK_IO=pread";
  } else {
    uring_ = std::make_unique<UringIo>(kRings, site.io.queue_depth, site.io.block_size);
    if (!uring_->available()) pread_reason_ = "io_uring unavailable: " + uring_->unavailable_reason();
  }
  // Room first, from the filesystem's own count, so that a full disk is named with both sizes
  // before anything is created (posix_fallocate below still reserves the bytes for the run).
  struct statvfs fs {};
  if (bytes > 0 && ::statvfs(site.directory.c_str(), &fs) == 0) {
    const uint64_t available = uint64_t(fs.f_bavail) * uint64_t(fs.f_frsize);
    MEMFIT_CHECK(available >= bytes, "memory", "the {} tier needs {} in {}, whose filesystem has {} free", tier_name(tier),
                 format_bytes(bytes), site.directory, format_bytes(available));
  }
  // Locked before it is truncated: two runs given the same --offload-dir (and rank) would
  // otherwise share one file, each truncating and overwriting the other's tier.
  fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  MEMFIT_CHECK(fd_ >= 0, "memory", "cannot create {}: {}", path_, std::strerror(errno));
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    ::close(fd_);  // not unlinked: the file is the other run's
    fd_ = -1;
    throw Error("memory", err == EWOULDBLOCK ? fmt::format("{} is in use by another memfit run: give each run its own "
                                                           "--offload-dir",
                                                           path_)
                                             : fmt::format("cannot lock {}: {}", path_, std::strerror(err)));
  }
  if (::ftruncate(fd_, 0) != 0) {
    const int err = errno;
    ::close(fd_);
    fd_ = -1;
    throw Error("memory", fmt::format("cannot truncate {}: {}", path_, std::strerror(err)));
  }
  if (bytes == 0) return;
  // posix_fallocate returns the error instead of setting errno.
  if (const int err = posix_fallocate(fd_, 0, off_t(bytes)); err != 0) {
    ::unlink(path_.c_str());
    ::close(fd_);
    fd_ = -1;
    throw Error("memory", fmt::format("cannot reserve {} for {}: {}", format_bytes(bytes), path_, std::strerror(err)));
  }
  direct_fd_ = ::open(path_.c_str(), O_RDWR | O_DIRECT | O_CLOEXEC);
  if (direct_fd_ < 0) no_direct_reason_ = std::strerror(errno);
}

std::string DiskFile::describe() const {
  const std::string how = uses_io_uring() ? fmt::format("io_uring queue depth {} x {}", uring_->queue_depth(),
                                                         format_bytes(uring_->block_size()))
                                          : "pread/pwrite: " + pread_reason_;
  return fmt::format("{} ({}, {}, {})", path_, format_bytes(size_), how,
                     direct() ? "O_DIRECT" : "through the page cache: O_DIRECT refused, " + no_direct_reason_);
}

DiskFile::~DiskFile() {
  if (direct_fd_ >= 0) ::close(direct_fd_);
  if (fd_ < 0) return;
  ::unlink(path_.c_str());  // while still locked: no other run holds this name's file now
  ::close(fd_);
}

// The leading bytes of a request that O_DIRECT can move: all whole 4 KiB blocks when the
// address and the offset are aligned, else none.
static size_t direct_prefix(int direct_fd, const void* data, uint64_t offset, size_t bytes) {
  if (direct_fd < 0 || reinterpret_cast<uintptr_t>(data) % kDiskAlignment != 0 || offset % kDiskAlignment != 0) return 0;
  return bytes / kDiskAlignment * kDiskAlignment;
}

void DiskFile::transfer(IoDirection dir, uint64_t offset, std::byte* data, size_t bytes) const {
  const size_t direct = direct_prefix(direct_fd_, data, offset, bytes);
  auto move = [&](IoFiles files, std::byte* at, uint64_t where, size_t n) {
    IoResult r;
    if (n > 0 && !(uses_io_uring() && uring_->transfer(dir, files, at, where, n, r))) {
      r = sync_transfer(dir, files, at, where, n);
    }
    return r;
  };
  IoResult r = move(IoFiles{direct_fd_, fd_}, data, offset, direct);
  if (r.ok()) r = move(IoFiles{fd_, fd_}, data + direct, offset + direct, bytes - direct);
  if (r.ok()) return;
  const bool reading = dir == IoDirection::read;
  throw Error("memory", fmt::format("cannot {} {}: {}", reading ? "read" : "write", path_,
                                    r.error != 0 ? std::strerror(r.error)
                                    : reading    ? "the file was truncated"
                                                 : "no progress"));
}

void DiskFile::write(uint64_t offset, std::span<const std::byte> bytes) {
  check_range(*this, offset, bytes.size(), "write");
  if (bytes.empty()) return;  // wrote nothing: the high-water mark stays
  // The bytes are only read: one transfer routine serves both directions.
  transfer(IoDirection::write, offset, const_cast<std::byte*>(bytes.data()), bytes.size());
  // Writers on several threads: the highest end wins, whichever finishes last.
  const uint64_t end = offset + bytes.size();
  uint64_t high = highest_written_.load(std::memory_order_relaxed);
  while (end > high && !highest_written_.compare_exchange_weak(high, end, std::memory_order_acq_rel)) {
  }
}

void DiskFile::read(uint64_t offset, std::span<std::byte> bytes) const {
  check_range(*this, offset, bytes.size(), "read");
  transfer(IoDirection::read, offset, bytes.data(), bytes.size());
}

}  // namespace memfit
