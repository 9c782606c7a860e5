#include "memory/uring_io.hpp"

#include <liburing.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <vector>

#include "core/error.hpp"

namespace memfit {

namespace {

constexpr uint64_t kAlignment = 4096;  // what O_DIRECT requires of address, offset and length

bool aligned(const std::byte* data, uint64_t offset, uint64_t bytes) {
  return (reinterpret_cast<uintptr_t>(data) | offset | bytes) % kAlignment == 0;
}

bool transient(int err) { return err == EINTR || err == EAGAIN; }

// One block of a transfer while it is in flight; a short completion moves its start on.
struct Piece {
  std::byte* data = nullptr;
  uint64_t offset = 0;
  uint32_t bytes = 0;
  int fd = -1;
};

// Settles one completion into `result`; returns whether the piece goes back in flight (the
// rest of a short transfer, or a retry). Once the transfer has failed nothing is retried:
// the pieces in flight only need to land.
bool settle(Piece& p, int res, IoFiles files, IoResult& result) {
  if (res < 0 && transient(-res)) return result.ok();
  if (res < 0) {
    if (result.ok()) result.error = -res;
    return false;
  }
  if (res == 0) {
    if (result.ok()) result.hit_end = true;
    return false;
  }
  if (uint32_t(res) >= p.bytes) return false;
  p.data += res;
  p.offset += uint64_t(res);
  p.bytes -= uint32_t(res);
  // A read cut short by the end of the file leaves an unaligned rest. A filesystem that checks
  // O_DIRECT alignment before the end of the file would refuse it (EINVAL) and hide the
  // truncation the next read reports; the page-cache descriptor takes it.
  if (!aligned(p.data, p.offset, p.bytes)) p.fd = files.buffered;
  return result.ok();
}

}  // namespace

IoResult sync_transfer(IoDirection dir, IoFiles files, std::byte* data, uint64_t offset, size_t bytes) {
  int fd = files.direct;
  size_t done = 0;
  while (done < bytes) {
    const ssize_t n = dir == IoDirection::read ? ::pread(fd, data + done, bytes - done, off_t(offset + done))
                                               : ::pwrite(fd, data + done, bytes - done, off_t(offset + done));
    if (n < 0 && transient(errno)) continue;
    if (n < 0) return {errno, false};
    if (n == 0) return {0, true};
    done += size_t(n);
    if (!aligned(data + done, offset + done, bytes - done)) fd = files.buffered;
  }
  return {};
}

struct UringIo::Ring {
  io_uring ring{};
  bool initialized = false;
  std::vector<Piece> pieces;  // one per request the ring may hold, indexed by user_data
  std::vector<int> idle;      // pieces not in flight
  std::atomic_flag held;      // clear: free for the next caller
  ~Ring() {
    if (initialized) io_uring_queue_exit(&ring);
  }
};

UringIo::UringIo(int rings, int queue_depth, uint64_t block_size) : queue_depth_(queue_depth), block_size_(block_size) {
  MEMFIT_CHECK(queue_depth >= 1 && queue_depth <= 4096, "memory", "the disk queue depth must be 1 to 4096, not {}",
               queue_depth);
  // A request's length is 32 bits in the ring; blocks move with O_DIRECT.
  MEMFIT_CHECK(block_size >= kAlignment && block_size <= (uint64_t(1) << 30) && block_size % kAlignment == 0,
               "memory", "the disk block size must be a multiple of 4 KiB up to 1 GiB, not {} bytes", block_size);
  rings_ = std::make_unique<std::unique_ptr<Ring>[]>(size_t(rings));
  for (int i = 0; i < rings; ++i) {
    auto r = std::make_unique<Ring>();
    if (const int rc = io_uring_queue_init(unsigned(queue_depth), &r->ring, 0); rc < 0) {
      reason_ = std::strerror(-rc);
      rings_.reset();  // all or none: describe() states one way for every transfer
      ring_count_ = 0;
      return;
    }
    r->initialized = true;
    r->pieces.resize(size_t(queue_depth));
    for (int p = queue_depth - 1; p >= 0; --p) r->idle.push_back(p);
    rings_[size_t(i)] = std::move(r);
    ring_count_ = i + 1;
  }
}

UringIo::~UringIo() = default;

bool UringIo::transfer(IoDirection dir, IoFiles files, std::byte* data, uint64_t offset, size_t bytes,
                       IoResult& result) {
  for (int i = 0; i < ring_count_; ++i) {
    Ring& r = *rings_[size_t(i)];
    if (r.held.test_and_set(std::memory_order_acquire)) continue;
    result = run(r, dir, files, data, offset, bytes);
    r.held.clear(std::memory_order_release);
    return true;
  }
  return false;
}

IoResult UringIo::run(Ring& r, IoDirection dir, IoFiles files, std::byte* data, uint64_t offset, size_t bytes) {
  auto queue = [&](int i) {
    const Piece& p = r.pieces[size_t(i)];
    io_uring_sqe* sqe = io_uring_get_sqe(&r.ring);
    MEMFIT_ASSERT(sqe != nullptr, "the ring holds {} requests, no more than its {} entries", r.pieces.size(),
                  r.pieces.size());
    if (dir == IoDirection::read) {
      io_uring_prep_read(sqe, p.fd, p.data, p.bytes, p.offset);
    } else {
      io_uring_prep_write(sqe, p.fd, p.data, p.bytes, p.offset);
    }
    io_uring_sqe_set_data(sqe, reinterpret_cast<void*>(uintptr_t(i)));
  };
  IoResult result;
  size_t issued = 0;
  int in_flight = 0;
  for (;;) {
    while (result.ok() && issued < bytes && !r.idle.empty()) {
      const int i = r.idle.back();
      r.idle.pop_back();
      const size_t n = size_t(std::min<uint64_t>(block_size_, bytes - issued));
      r.pieces[size_t(i)] = Piece{data + issued, offset + issued, uint32_t(n), files.direct};
      queue(i);
      issued += n;
      ++in_flight;
    }
    if (in_flight == 0) return result;
    // Interrupted or short of kernel resources, the pieces stay queued and go on the next
    // call. Any other failure means the ring itself is unusable: a memfit bug, and returning
    // would leave the caller's memory under requests still in flight.
    const int rc = io_uring_submit_and_wait(&r.ring, 1);
    MEMFIT_ASSERT(rc >= 0 || transient(-rc) || rc == -EBUSY, "io_uring_enter failed: {}", std::strerror(-rc));
    unsigned head = 0, seen = 0;
    io_uring_cqe* cqe = nullptr;
    io_uring_for_each_cqe(&r.ring, head, cqe) {
      ++seen;
      const int i = int(reinterpret_cast<uintptr_t>(io_uring_cqe_get_data(cqe)));
      if (settle(r.pieces[size_t(i)], cqe->res, files, result)) {
        queue(i);
      } else {
        r.idle.push_back(i);
        --in_flight;
      }
    }
    io_uring_cq_advance(&r.ring, seen);
  }
}

}  // namespace memfit
