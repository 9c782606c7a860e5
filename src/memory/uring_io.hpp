// How DiskFile moves bytes between memory and its descriptors. One synchronous pread/pwrite
// keeps a single request at the disk at a time, which leaves an NVMe drive mostly idle: its
// bandwidth comes from many requests in flight. UringIo splits a transfer into blocks and
// keeps up to queue_depth of them in flight on an io_uring, still returning only when every
// byte has moved (the caller's contract stays synchronous). The rings are made once, in the
// constructor: a step allocates nothing, and a kernel that refuses io_uring (ENOSYS, or EPERM
// under a seccomp filter) is known before the first step, when DiskFile falls back to
// pread/pwrite and says why.
// Invariant: no request is left in flight when transfer() returns, failed or not, so the
// caller's memory is never written after it regains it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace memfit {

enum class IoDirection { read, write };

// How a transfer ended: ok, an errno, or the end of the file (a read returned 0 bytes: the
// file is shorter than the caller believed; a write of 0 bytes made no progress).
struct IoResult {
  int error = 0;
  bool hit_end = false;
  bool ok() const { return error == 0 && !hit_end; }
};

// The descriptors of one file: `direct` may be an O_DIRECT one, whose address, offset and
// length must be 4 KiB multiples; `buffered` takes any remainder a short transfer leaves
// misaligned. Both may be the same descriptor.
struct IoFiles {
  int direct;
  int buffered;
};

// pread/pwrite until every byte moved, retrying EINTR and EAGAIN.
IoResult sync_transfer(IoDirection dir, IoFiles files, std::byte* data, uint64_t offset, size_t bytes);

class UringIo {
 public:
  // Makes `rings` rings; one caller holds a ring for the length of a transfer, so `rings`
  // callers can transfer at once. Never throws for a kernel that refuses io_uring:
  // available() is then false and unavailable_reason() says why.
  UringIo(int rings, int queue_depth, uint64_t block_size);
  ~UringIo();
  UringIo(const UringIo&) = delete;
  UringIo& operator=(const UringIo&) = delete;

  bool available() const { return ring_count_ > 0; }
  const std::string& unavailable_reason() const { return reason_; }
  int queue_depth() const { return queue_depth_; }
  uint64_t block_size() const { return block_size_; }

  // Moves `bytes` at `offset` in blocks of block_size(), queue_depth() in flight. Returns
  // false, having moved nothing, when every ring is held by another caller at this moment.
  bool transfer(IoDirection dir, IoFiles files, std::byte* data, uint64_t offset, size_t bytes, IoResult& result);

 private:
  struct Ring;
  IoResult run(Ring& ring, IoDirection dir, IoFiles files, std::byte* data, uint64_t offset, size_t bytes);

  int queue_depth_;
  uint64_t block_size_;
  std::unique_ptr<std::unique_ptr<Ring>[]> rings_;
  int ring_count_ = 0;
  std::string reason_;
};

}  // namespace memfit
