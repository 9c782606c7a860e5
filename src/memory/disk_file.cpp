#include "memory/disk_file.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "core/bytes.hpp"
#include "core/error.hpp"

namespace memfit {

namespace {

void check_range(const DiskFile& f, uint64_t offset, size_t bytes, const char* verb) {
  MEMFIT_CHECK(offset <= f.size() && bytes <= f.size() - offset, "memory", "{} of {} bytes at {} outside {} ({} bytes)",
               verb, bytes, offset, f.path(), f.size());
}

}  // namespace

DiskFile::DiskFile(Tier tier, uint64_t bytes, const BufferSite& site) : tier_(tier), size_(bytes) {
  MEMFIT_CHECK(!site.directory.empty(), "memory", "the {} tier needs a directory for its file (--offload-dir)",
               tier_name(tier));
  path_ = fmt::format("{}/memfit-rank{}.tier", site.directory, site.rank);
  fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  MEMFIT_CHECK(fd_ >= 0, "memory", "cannot create {}: {}", path_, std::strerror(errno));
  if (bytes == 0) return;
  // posix_fallocate returns the error instead of setting errno.
  if (const int err = posix_fallocate(fd_, 0, off_t(bytes)); err != 0) {
    ::close(fd_);
    ::unlink(path_.c_str());
    fd_ = -1;
    throw Error("memory", fmt::format("cannot reserve {} for {}: {}", format_bytes(bytes), path_, std::strerror(err)));
  }
  direct_fd_ = ::open(path_.c_str(), O_RDWR | O_DIRECT | O_CLOEXEC);
  if (direct_fd_ < 0) no_direct_reason_ = std::strerror(errno);
}

std::string DiskFile::describe() const {
  return fmt::format("{} ({}, {})", path_, format_bytes(size_),
                     direct() ? "O_DIRECT" : "through the page cache: O_DIRECT refused, " + no_direct_reason_);
}

DiskFile::~DiskFile() {
  if (direct_fd_ >= 0) ::close(direct_fd_);
  if (fd_ < 0) return;
  ::close(fd_);
  ::unlink(path_.c_str());
}

// The leading bytes of a request that O_DIRECT can move: all whole 4 KiB blocks when the
// address and the offset are aligned, else none.
static size_t direct_prefix(int direct_fd, const void* data, uint64_t offset, size_t bytes) {
  if (direct_fd < 0 || reinterpret_cast<uintptr_t>(data) % kDiskAlignment != 0 || offset % kDiskAlignment != 0) return 0;
  return bytes / kDiskAlignment * kDiskAlignment;
}

void DiskFile::write(uint64_t offset, std::span<const std::byte> bytes) {
  check_range(*this, offset, bytes.size(), "write");
  const size_t direct = direct_prefix(direct_fd_, bytes.data(), offset, bytes.size());
  size_t done = 0;
  while (done < bytes.size()) {
    const bool d = done < direct;
    const ssize_t n = ::pwrite(d ? direct_fd_ : fd_, bytes.data() + done, (d ? direct : bytes.size()) - done,
                               off_t(offset + done));
    if (n < 0 && errno == EINTR) continue;
    MEMFIT_CHECK(n > 0, "memory", "cannot write {}: {}", path_, n < 0 ? std::strerror(errno) : "no progress");
    done += size_t(n);
  }
  if (offset + bytes.size() > highest_written_) highest_written_ = offset + bytes.size();
}

void DiskFile::read(uint64_t offset, std::span<std::byte> bytes) const {
  check_range(*this, offset, bytes.size(), "read");
  const size_t direct = direct_prefix(direct_fd_, bytes.data(), offset, bytes.size());
  size_t done = 0;
  while (done < bytes.size()) {
    const bool d = done < direct;
    const ssize_t n = ::pread(d ? direct_fd_ : fd_, bytes.data() + done, (d ? direct : bytes.size()) - done,
                              off_t(offset + done));
    if (n < 0 && errno == EINTR) continue;
    MEMFIT_CHECK(n > 0, "memory", "cannot read {}: {}", path_, n < 0 ? std::strerror(errno) : "the file was truncated");
    done += size_t(n);
  }
}

}  // namespace memfit
