#include "io/mapped_file.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "core/error.hpp"

namespace memfit {

namespace {

std::string errno_text(int err) { return std::strerror(err); }

std::string parent_directory(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

}  // namespace

MappedFile MappedFile::open(const std::string& path, std::string_view piece) {
  // O_NONBLOCK so that opening a FIFO by mistake fails below instead of hanging.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    const int err = errno;
    MEMFIT_CHECK(err != ENOENT, piece, "{}: no such file", path);
    throw Error(piece, fmt::format("{}: cannot open: {}", path, errno_text(err)));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    throw Error(piece, fmt::format("{}: cannot stat: {}", path, errno_text(err)));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    MEMFIT_CHECK(!S_ISDIR(st.st_mode), piece, "{}: is a directory, not a file", path);
    throw Error(piece, fmt::format("{}: not a regular file", path));
  }
  MappedFile file;
  file.path_ = path;
  file.size_ = uint64_t(st.st_size);
  if (file.size_ > 0) {
    void* p = ::mmap(nullptr, size_t(file.size_), PROT_READ, MAP_PRIVATE, fd, 0);
    const int err = errno;
    if (p == MAP_FAILED) {
      ::close(fd);
      throw Error(piece, fmt::format("{}: cannot map {} bytes: {}", path, file.size_, errno_text(err)));
    }
    file.data_ = static_cast<const std::byte*>(p);
  }
  ::close(fd);  // the mapping keeps the file alive
  return file;
}

MappedFile::MappedFile(MappedFile&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      path_(std::move(other.path_)) {}

MappedFile& MappedFile::operator=(MappedFile&& other) noexcept {
  if (this != &other) {
    release();
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    path_ = std::move(other.path_);
  }
  return *this;
}

MappedFile::~MappedFile() { release(); }

void MappedFile::drop_pages(uint64_t offset, uint64_t count) const noexcept {
  if (!data_ || offset >= size_) return;
  const uint64_t page = uint64_t(::sysconf(_SC_PAGESIZE));
  const uint64_t end = std::min(size_, offset + std::min(count, size_ - offset));
  // Whole pages only, except that the file's last page may end inside the range.
  const uint64_t first = (offset + page - 1) / page * page;
  const uint64_t last = end == size_ ? (end + page - 1) / page * page : end / page * page;
  if (last <= first) return;
  // Advice only: a failure leaves the pages resident, which costs memory but not correctness.
  ::madvise(const_cast<std::byte*>(data_) + first, size_t(last - first), MADV_DONTNEED);
}

void MappedFile::release() noexcept {
  if (data_) ::munmap(const_cast<std::byte*>(data_), size_t(size_));
  data_ = nullptr;
  size_ = 0;
}

AtomicFileWriter::AtomicFileWriter(std::string path, std::string_view piece)
    : path_(std::move(path)), temp_path_(path_ + ".tmp"), piece_(piece) {
  fd_ = ::open(temp_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  MEMFIT_CHECK(fd_ >= 0, piece_, "{}: cannot create {}: {}", path_, temp_path_, errno_text(errno));
}

AtomicFileWriter::~AtomicFileWriter() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_) ::unlink(temp_path_.c_str());
}

void AtomicFileWriter::write(const void* bytes, uint64_t count) {
  MEMFIT_ASSERT(fd_ >= 0 && !committed_, "write to a closed AtomicFileWriter for {}", path_);
  const char* p = static_cast<const char*>(bytes);
  // The kernel may write less than asked (signals, large counts): loop until done.
  while (count > 0) {
    const size_t chunk = size_t(std::min<uint64_t>(count, uint64_t(1) << 30));
    const ssize_t n = ::write(fd_, p, chunk);
    if (n < 0 && errno == EINTR) continue;
    MEMFIT_CHECK(n > 0, piece_, "{}: write failed: {}", path_, n < 0 ? errno_text(errno) : "no progress");
    p += n;
    count -= uint64_t(n);
  }
}

void AtomicFileWriter::commit() {
  MEMFIT_ASSERT(fd_ >= 0 && !committed_, "commit of a closed AtomicFileWriter for {}", path_);
  MEMFIT_CHECK(::fsync(fd_) == 0, piece_, "{}: fsync failed: {}", path_, errno_text(errno));
  const int fd = std::exchange(fd_, -1);
  MEMFIT_CHECK(::close(fd) == 0, piece_, "{}: close failed: {}", path_, errno_text(errno));
  MEMFIT_CHECK(::rename(temp_path_.c_str(), path_.c_str()) == 0, piece_, "{}: cannot rename {} over it: {}", path_,
               temp_path_, errno_text(errno));
  committed_ = true;
  // The rename is durable only once the directory entry is on disk. Some file systems do not
  // support fsync on directories (EINVAL); the new content is then as durable as they allow.
  const std::string dir = parent_directory(path_);
  const int dir_fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  MEMFIT_CHECK(dir_fd >= 0, piece_, "{}: cannot open directory {} to sync it: {}", path_, dir, errno_text(errno));
  const int rc = ::fsync(dir_fd);
  const int err = errno;
  ::close(dir_fd);
  MEMFIT_CHECK(rc == 0 || err == EINVAL, piece_, "{}: fsync of directory {} failed: {}", path_, dir,
               errno_text(err));
}

}  // namespace memfit
