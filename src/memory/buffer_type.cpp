#include "memory/buffer_type.hpp"

#include "memory/arena.hpp"
#include "memory/disk_file.hpp"

namespace memfit {

namespace {

class HostArenaBufferType final : public BufferType {
 public:
  std::string_view name() const override { return "host-arena"; }
  uint64_t alignment() const override { return 64; }  // a cache line, one AVX-512 vector
  bool host_readable() const override { return true; }
  HighWaterMethod high_water_method() const override { return HighWaterMethod::sentinel_scan; }
  std::unique_ptr<Buffer> allocate(Tier tier, uint64_t bytes, const BufferSite&) const override {
    return std::make_unique<Arena>(tier, bytes);
  }
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
  static const HostArenaBufferType type;
  return type;
}

const BufferType& disk_file_buffer_type() {
  static const DiskFileBufferType type;
  return type;
}

const BufferType& default_buffer_type(Tier tier) {
  return tier == Tier::disk ? disk_file_buffer_type() : host_arena_buffer_type();
}

}  // namespace memfit
