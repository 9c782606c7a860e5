// Arena: the one block of memory of a tier, allocated once at the planned size before the
// first step. It is mapped with transparent huge pages requested, and every byte is written
// with a sentinel at start-up: that pre-faults every page (steps never fault) and lets the
// arena measure its own high-water mark afterwards, as the highest byte that no longer holds
// the sentinel. An inaccessible guard page follows the mapping, so a write past the page
// holding the last planned byte faults at once; a write past the planned size within that
// page shows up in the measured high-water mark. It is the host-RAM buffer type's buffer.
#pragma once

#include <cstddef>
#include <cstdint>

#include "graph/tensor.hpp"
#include "memory/buffer_type.hpp"

namespace memfit {

class Arena final : public Buffer {
 public:
  static constexpr unsigned char kSentinel = 0xA5;

  Arena() = default;
  Arena(Tier tier, uint64_t bytes);  // throws [memory] when the memory cannot be mapped
  ~Arena() override;
  Arena(Arena&& other) noexcept;
  Arena& operator=(Arena&& other) noexcept;
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;

  std::byte* data() const { return base_; }
  uint64_t size() const override { return size_; }
  Tier tier() const override { return tier_; }
  std::byte* host_data() const override { return base_; }
  void write(uint64_t offset, std::span<const std::byte> bytes) override;
  void read(uint64_t offset, std::span<std::byte> bytes) const override;
  // Offset one past the highest byte that differs from the sentinel now (0 if none), scanning
  // the whole mapping (also the slack after size(), up to the guard page) from the top down.
  uint64_t scan_top() const;
  // The high-water mark: the larger of scan_top() and every top noted before. Profile runs
  // return dead buffers to the sentinel after each op (the scan then shows what is live now);
  // they note the top before each such fill, so the mark still covers the whole run.
  uint64_t measured_high_water() const override;
  void note_top(uint64_t top) { noted_top_ = top > noted_top_ ? top : noted_top_; }

 private:
  void release();

  Tier tier_ = Tier::device;
  std::byte* base_ = nullptr;
  uint64_t size_ = 0;
  uint64_t mapped_ = 0;  // accessible bytes (size rounded up to pages)
  uint64_t noted_top_ = 0;
};

}  // namespace memfit
