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
}

DiskFile::~DiskFile() {
  if (fd_ < 0) return;
  ::close(fd_);
  ::unlink(path_.c_str());
}

void DiskFile::write(uint64_t offset, std::span<const std::byte> bytes) {
  check_range(*this, offset, bytes.size(), "write");
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::pwrite(fd_, bytes.data() + done, bytes.size() - done, off_t(offset + done));
    if (n < 0 && errno == EINTR) continue;
    MEMFIT_CHECK(n > 0, "memory", "cannot write {}: {}", path_, n < 0 ? std::strerror(errno) : "no progress");
    done += size_t(n);
  }
  if (offset + bytes.size() > highest_written_) highest_written_ = offset + bytes.size();
}

void DiskFile::read(uint64_t offset, std::span<std::byte> bytes) const {
  check_range(*this, offset, bytes.size(), "read");
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::pread(fd_, bytes.data() + done, bytes.size() - done, off_t(offset + done));
    if (n < 0 && errno == EINTR) continue;
    MEMFIT_CHECK(n > 0, "memory", "cannot read {}: {}", path_, n < 0 ? std::strerror(errno) : "the file was truncated");
    done += size_t(n);
  }
}

}  // namespace memfit
