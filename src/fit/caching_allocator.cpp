#include "fit/caching_allocator.hpp"

#include <algorithm>
#include <set>
#include <vector>

#include "core/error.hpp"

namespace memfit {

namespace {

constexpr uint64_t kMiB = uint64_t(1) << 20;
constexpr uint64_t kMinBlock = 512;         // rounding, and the small pool's least split remainder
constexpr uint64_t kSmallRequest = kMiB;    // largest small-pool request; the large pool's least split remainder
constexpr uint64_t kSmallSegment = 2 * kMiB;
constexpr uint64_t kMinLargeAlloc = 10 * kMiB;
constexpr uint64_t kMidSegment = 20 * kMiB;  // for large requests under kMinLargeAlloc
constexpr uint64_t kRoundLarge = 2 * kMiB;

struct Block {
  uint64_t size = 0, offset = 0;
  int64_t segment = 0;  // creation order; a later segment lies at a lower address
  bool small = false, free = true;
  int64_t prev = -1, next = -1;  // neighbours in the segment (indices into blocks)
};

}  // namespace

struct CachingAllocatorModel::State {
  std::vector<Block> blocks;       // every block ever made (merged ones stay, unused)
  std::vector<int64_t> handed_out;  // block index of each allocation id (-1 once freed)
  // Free blocks of a pool by (size, address): the smallest that fits, lowest address first.
  // A bare size compares by size alone, so lower_bound(size) finds the lowest-addressed block of
  // the smallest size that fits.
  struct Size {
    uint64_t bytes;
  };
  struct BySizeThenAddress {
    using is_transparent = void;
    const std::vector<Block>* blocks;
    bool operator()(int64_t a, int64_t b) const {
      const Block &x = (*blocks)[size_t(a)], &y = (*blocks)[size_t(b)];
      if (x.size != y.size) return x.size < y.size;
      if (x.segment != y.segment) return x.segment > y.segment;
      return x.offset < y.offset;
    }
    bool operator()(int64_t a, Size s) const { return (*blocks)[size_t(a)].size < s.bytes; }
    bool operator()(Size s, int64_t a) const { return s.bytes < (*blocks)[size_t(a)].size; }
  };
  std::set<int64_t, BySizeThenAddress> pool[2]{std::set<int64_t, BySizeThenAddress>{BySizeThenAddress{&blocks}},
                                               std::set<int64_t, BySizeThenAddress>{BySizeThenAddress{&blocks}}};
  uint64_t reserved = 0, allocated = 0, peak_reserved = 0, peak_allocated = 0;
  int64_t segments = 0;

  int64_t take_free(bool small, uint64_t size) {
    auto& p = pool[small ? 1 : 0];
    const auto it = p.lower_bound(Size{size});
    if (it == p.end()) return -1;
    const int64_t b = *it;
    p.erase(it);
    return b;
  }

  void merge(int64_t into, int64_t gone) {  // gone is into's free neighbour, after it
    Block& a = blocks[size_t(into)];
    const Block g = blocks[size_t(gone)];
    a.size += g.size;
    a.next = g.next;
    if (g.next >= 0) blocks[size_t(g.next)].prev = into;
  }
};

CachingAllocatorModel::CachingAllocatorModel() : s_(std::make_unique<State>()) {}
CachingAllocatorModel::~CachingAllocatorModel() = default;

uint64_t CachingAllocatorModel::rounded(uint64_t bytes) {
  return bytes < kMinBlock ? kMinBlock : (bytes + kMinBlock - 1) / kMinBlock * kMinBlock;
}

uint64_t CachingAllocatorModel::segment_bytes(uint64_t size) {
  if (size <= kSmallRequest) return kSmallSegment;
  if (size < kMinLargeAlloc) return kMidSegment;
  return (size + kRoundLarge - 1) / kRoundLarge * kRoundLarge;
}

int64_t CachingAllocatorModel::allocate(uint64_t bytes) {
  State& s = *s_;
  const uint64_t size = rounded(bytes);
  const bool small = size <= kSmallRequest;
  int64_t b = s.take_free(small, size);
  if (b < 0) {
    const uint64_t seg = segment_bytes(size);
    s.blocks.push_back(Block{seg, 0, s.segments++, small});
    b = int64_t(s.blocks.size()) - 1;
    s.reserved += seg;
    s.peak_reserved = std::max(s.peak_reserved, s.reserved);
  }
  const uint64_t remaining = s.blocks[size_t(b)].size - size;
  if (small ? remaining >= kMinBlock : remaining > kSmallRequest) {
    const Block& whole = s.blocks[size_t(b)];
    Block rest{remaining, whole.offset + size, whole.segment, small, true, b, whole.next};
    s.blocks.push_back(rest);
    const int64_t r = int64_t(s.blocks.size()) - 1;
    Block& kept = s.blocks[size_t(b)];  // after the push: the vector may have moved
    if (kept.next >= 0) s.blocks[size_t(kept.next)].prev = r;
    kept.next = r;
    kept.size = size;
    s.pool[small ? 1 : 0].insert(r);
  }
  Block& got = s.blocks[size_t(b)];
  got.free = false;
  s.allocated += got.size;
  s.peak_allocated = std::max(s.peak_allocated, s.allocated);
  s.handed_out.push_back(b);
  return int64_t(s.handed_out.size()) - 1;
}

void CachingAllocatorModel::free(int64_t id) {
  State& s = *s_;
  MEMFIT_CHECK(id >= 0 && id < int64_t(s.handed_out.size()) && s.handed_out[size_t(id)] >= 0, "fit",
               "allocator trace frees block {}, which is not allocated", id);
  int64_t b = s.handed_out[size_t(id)];
  s.handed_out[size_t(id)] = -1;
  Block& blk = s.blocks[size_t(b)];
  blk.free = true;
  s.allocated -= blk.size;
  auto& p = s.pool[blk.small ? 1 : 0];
  if (const int64_t n = blk.next; n >= 0 && s.blocks[size_t(n)].free) {
    p.erase(n);
    s.merge(b, n);
  }
  if (const int64_t v = s.blocks[size_t(b)].prev; v >= 0 && s.blocks[size_t(v)].free) {
    p.erase(v);
    s.merge(v, b);
    b = v;
  }
  p.insert(b);
}

uint64_t CachingAllocatorModel::reserved() const { return s_->reserved; }
uint64_t CachingAllocatorModel::allocated() const { return s_->allocated; }
uint64_t CachingAllocatorModel::peak_reserved() const { return s_->peak_reserved; }
uint64_t CachingAllocatorModel::peak_allocated() const { return s_->peak_allocated; }
int64_t CachingAllocatorModel::segments() const { return s_->segments; }

AllocatorReplay replay_caching_allocator(std::span<const int64_t> events) {
  CachingAllocatorModel m;
  for (int64_t e : events) {
    if (e > 0) m.allocate(uint64_t(e));
    else m.free(-e);
  }
  return {m.peak_reserved(), m.peak_allocated(), m.segments()};
}

}  // namespace memfit
