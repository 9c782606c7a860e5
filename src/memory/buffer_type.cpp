#include "memory/buffer_type.hpp"

#include "memory/arena.hpp"
#include "memory/disk_file.hpp"

namespace memfit {

namespace {

class HostArenaBufferType final : public BufferType {
 public:
  explicit HostArenaBufferType(uint64_t alignment) : alignment_(alignment) {}
  std::string_view name() const override { return alignment_ == 64 ? "host-arena" : "host-staging-arena"; }
  uint64_t alignment() const override { return alignment_; }
  bool host_readable() const override { return true; }
  HighWaterMethod high_water_method() const override { return HighWaterMethod::sentinel_scan; }
  std::unique_ptr<Buffer> allocate(Tier tier, uint64_t bytes, const BufferSite&) const override {
    return std::make_unique<Arena>(tier, bytes);
  }

 private:
  uint64_t alignment_;
};

class DiskFileBufferType final : public BufferType {
 public:
  std::string_view name() const override { return "disk-file"; }
  uint64_t alignment() const override { return kDiskAlignment; }
  bool host_readable() const override { return false; }
  HighWaterMethod high_water_method() const override { return HighWaterMethod::highest_write; }
  std::unique_ptr<Buffer> allocate(Tier tier, uint64_t bytes, const BufferSite& site) const override {
    return std::make_unique<DiskFile>(tier, bytes, site);
  }
};

}  // namespace

const BufferType& host_arena_buffer_type() {
  static const HostArenaBufferType type(64);  // a cache line, one AVX-512 vector
  return type;
}

const BufferType& host_staging_buffer_type() {
  static const HostArenaBufferType type(kDiskAlignment);
  return type;
}

const BufferType& disk_file_buffer_type() {
  static const DiskFileBufferType type;
  return type;
}

const BufferType& default_buffer_type(Tier tier) {
  switch (tier) {
    case Tier::device: return host_arena_buffer_type();
    case Tier::host: return host_staging_buffer_type();
    case Tier::disk: return disk_file_buffer_type();
  }
  return host_arena_buffer_type();
}

}  // namespace memfit
