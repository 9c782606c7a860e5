#include "memory/arena.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <utility>

#include "core/bytes.hpp"
#include "core/error.hpp"

namespace memfit {

Arena::Arena(Tier tier, uint64_t bytes) : tier_(tier), size_(bytes) {
  if (bytes == 0) return;
  const uint64_t page = uint64_t(sysconf(_SC_PAGESIZE));
  mapped_ = (bytes + page - 1) / page * page;
  void* p = mmap(nullptr, mapped_ + page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  MEMFIT_CHECK(p != MAP_FAILED, "memory", "could not map the {} arena of {}: {}", tier_name(tier), format_bytes(bytes),
               std::strerror(errno));
  base_ = static_cast<std::byte*>(p);
  MEMFIT_CHECK(mprotect(base_ + mapped_, page, PROT_NONE) == 0, "memory", "could not protect the arena's guard page: {}",
               std::strerror(errno));
  madvise(base_, mapped_, MADV_HUGEPAGE);  // advisory: fewer TLB misses where the kernel allows it
  std::memset(base_, kSentinel, mapped_);
}

Arena::~Arena() { release(); }

Arena::Arena(Arena&& o) noexcept
    : tier_(o.tier_), base_(std::exchange(o.base_, nullptr)), size_(std::exchange(o.size_, 0)),
      mapped_(std::exchange(o.mapped_, 0)), noted_top_(std::exchange(o.noted_top_, 0)) {}

Arena& Arena::operator=(Arena&& o) noexcept {
  if (this != &o) {
    release();
    tier_ = o.tier_;
    base_ = std::exchange(o.base_, nullptr);
    size_ = std::exchange(o.size_, 0);
    mapped_ = std::exchange(o.mapped_, 0);
    noted_top_ = std::exchange(o.noted_top_, 0);
  }
  return *this;
}

void Arena::release() {
  if (base_) munmap(base_, mapped_ + uint64_t(sysconf(_SC_PAGESIZE)));
  base_ = nullptr;
}

void Arena::write(uint64_t offset, std::span<const std::byte> bytes) {
  MEMFIT_CHECK(offset <= size_ && bytes.size() <= size_ - offset, "memory", "write of {} bytes at {} outside the {} arena of {}",
               bytes.size(), offset, tier_name(tier_), size_);
  if (!bytes.empty()) std::memcpy(base_ + offset, bytes.data(), bytes.size());
}

void Arena::read(uint64_t offset, std::span<std::byte> bytes) const {
  MEMFIT_CHECK(offset <= size_ && bytes.size() <= size_ - offset, "memory", "read of {} bytes at {} outside the {} arena of {}",
               bytes.size(), offset, tier_name(tier_), size_);
  if (!bytes.empty()) std::memcpy(bytes.data(), base_ + offset, bytes.size());
}

uint64_t Arena::measured_high_water() const {
  const uint64_t now = scan_top();
  return now > noted_top_ ? now : noted_top_;
}

uint64_t Arena::scan_top() const {
  if (!base_) return 0;
  const auto* bytes = reinterpret_cast<const unsigned char*>(base_);
  // 64-byte blocks from the top (mapped_ is a multiple of the page size; profile runs scan
  // after every op, so this loop is worth vectorising), then words, then bytes.
  uint64_t end = mapped_;
  const uint64_t pattern = 0x0101010101010101ull * kSentinel;
  while (end >= 64) {
    uint64_t differs = 0;
    for (int k = 0; k < 8; ++k) {
      uint64_t w;
      std::memcpy(&w, bytes + end - 64 + 8 * k, 8);
      differs |= w ^ pattern;
    }
    if (differs) break;
    end -= 64;
  }
  while (end >= 8) {
    uint64_t w;
    std::memcpy(&w, bytes + end - 8, 8);
    if (w != pattern) break;
    end -= 8;
  }
  while (end > 0 && bytes[end - 1] == kSentinel) --end;
  return end;
}

}  // namespace memfit
