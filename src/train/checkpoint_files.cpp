// Durable file writes and checksums for checkpoints (see checkpoint_files.hpp). POSIX calls
// rather than streams: an ofstream neither fsyncs nor reports which write failed.
#include "train/checkpoint_files.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <cerrno>
#include <cstring>

#include "core/error.hpp"

namespace memfit {

namespace fs = std::filesystem;

Checksum::Checksum() : state_(XXH3_createState()) {
  MEMFIT_ASSERT(state_ != nullptr, "XXH3_createState failed");
  XXH3_64bits_reset(static_cast<XXH3_state_t*>(state_));
}

Checksum::~Checksum() { XXH3_freeState(static_cast<XXH3_state_t*>(state_)); }

void Checksum::update(const void* data, size_t bytes) {
  XXH3_64bits_update(static_cast<XXH3_state_t*>(state_), data, bytes);
}

void Checksum::reset() { XXH3_64bits_reset(static_cast<XXH3_state_t*>(state_)); }

uint64_t Checksum::digest() const { return XXH3_64bits_digest(static_cast<const XXH3_state_t*>(state_)); }

uint64_t checksum_of(std::string_view bytes) { return XXH3_64bits(bytes.data(), bytes.size()); }

std::string checksum_hex(uint64_t h) { return fmt::format("{:016x}", h); }

bool parse_checksum_hex(std::string_view s, uint64_t& h) {
  if (s.size() != 16) return false;
  h = 0;
  for (char c : s) {
    const int digit = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
    if (digit < 0) return false;
    h = h << 4 | uint64_t(digit);
  }
  return true;
}

DurableFile::DurableFile(const fs::path& path) : path_(path) {
  fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  MEMFIT_CHECK(fd_ >= 0, "checkpoint", "cannot create '{}': {}", path.string(), std::strerror(errno));
}

DurableFile::~DurableFile() {
  if (fd_ >= 0) ::close(fd_);
}

void DurableFile::write(const void* data, size_t bytes) {
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    const ssize_t n = ::write(fd_, p, bytes);
    if (n < 0 && errno == EINTR) continue;
    MEMFIT_CHECK(n > 0, "checkpoint", "writing '{}' failed: {}", path_.string(),
                 n < 0 ? std::strerror(errno) : "no progress (disk full?)");
    p += n;
    bytes -= size_t(n);
  }
}

void DurableFile::commit() {
  MEMFIT_CHECK(::fsync(fd_) == 0, "checkpoint", "fsync of '{}' failed: {}", path_.string(), std::strerror(errno));
  const int fd = fd_;
  fd_ = -1;
  MEMFIT_CHECK(::close(fd) == 0, "checkpoint", "closing '{}' failed: {}", path_.string(), std::strerror(errno));
  fsync_directory(path_.parent_path().empty() ? fs::path(".") : path_.parent_path());
}

void fsync_directory(const fs::path& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  MEMFIT_CHECK(fd >= 0, "checkpoint", "cannot open the directory '{}': {}", dir.string(), std::strerror(errno));
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  MEMFIT_CHECK(rc == 0, "checkpoint", "fsync of the directory '{}' failed: {}", dir.string(), std::strerror(err));
}

void replace_file_atomically(const fs::path& path, std::string_view text) {
  const fs::path tmp = path.string() + ".tmp";
  DurableFile out(tmp);
  out.write(text.data(), text.size());
  out.commit();
  std::error_code ec;
  fs::rename(tmp, path, ec);
  MEMFIT_CHECK(!ec, "checkpoint", "cannot rename '{}' to '{}': {}", tmp.string(), path.string(), ec.message());
  fsync_directory(path.parent_path().empty() ? fs::path(".") : path.parent_path());
}

std::string read_bounded_file(const fs::path& path, uint64_t max_bytes) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  MEMFIT_CHECK(fd >= 0, "checkpoint", "{}: cannot open: {}", path.string(), std::strerror(errno));
  struct stat st {};
  std::string text;
  bool ok = ::fstat(fd, &st) == 0 && uint64_t(st.st_size) <= max_bytes;
  if (ok) {
    text.resize(size_t(st.st_size));
    size_t done = 0;
    while (ok && done < text.size()) {
      const ssize_t n = ::read(fd, text.data() + done, text.size() - done);
      if (n < 0 && errno == EINTR) continue;
      ok = n > 0;
      done += ok ? size_t(n) : 0;
    }
  }
  ::close(fd);
  MEMFIT_CHECK(ok, "checkpoint", "{}: cannot read it (or it is larger than {} bytes)", path.string(), max_bytes);
  return text;
}

}  // namespace memfit
