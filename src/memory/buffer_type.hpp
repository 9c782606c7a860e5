// Buffer types: where the bytes of one tier live. A backend names the buffer type that serves
// each tier (Backend::buffer_type); the executor asks it for one buffer per tier, at the
// plan's peak for that tier, once, before the first step. Each type states the alignment the
// planner must respect for it, whether the host may address its bytes directly, and how it
// measures its own high-water mark, so planned == measured can be checked on every tier.
// Invariant: a buffer never grows or moves after allocate(); reads and writes outside
// [0, size()) throw [memory].
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>

#include "graph/tensor.hpp"

namespace memfit {

// How a buffer type measures the highest byte a run used.
enum class HighWaterMethod {
  sentinel_scan,  // filled with a sentinel at allocation; the highest byte that differs
  highest_write,  // the highest byte ever written through write()
};

// How a file-backed buffer moves its bytes: O_DIRECT transfers split into blocks of
// block_size bytes (a multiple of 4 KiB), up to queue_depth of them in flight at once, so one
// caller keeps the disk's queue full (DeepSpeed's aio.block_size and aio.queue_depth).
struct DiskIo {
  uint64_t block_size = uint64_t(1) << 20;
  int queue_depth = 8;
};

// Where a buffer that lives in a file goes. Ignored by memory-backed types.
struct BufferSite {
  std::string directory;  // one file per rank under it
  int rank = 0;
  DiskIo io;

  // Not an aggregate, so that BufferSite{dir, rank} keeps the default io without a
  // missing-initializer warning.
  BufferSite() = default;
  BufferSite(std::string dir, int r, DiskIo disk_io = {}) : directory(std::move(dir)), rank(r), io(disk_io) {}
};

class Buffer {
 public:
  virtual ~Buffer() = default;
  virtual Tier tier() const = 0;
  virtual uint64_t size() const = 0;
  // The first byte when the host can address the buffer directly, nullptr otherwise.
  virtual std::byte* host_data() const = 0;
  // Copies bytes in or out at `offset`; throws [memory] outside the buffer or on I/O failure.
  virtual void write(uint64_t offset, std::span<const std::byte> bytes) = 0;
  virtual void read(uint64_t offset, std::span<std::byte> bytes) const = 0;
  // One past the highest byte the run used, measured as the type's HighWaterMethod says.
  virtual uint64_t measured_high_water() const = 0;
  // Where the bytes are and how they move, for the run log ("" for memory).
  virtual std::string describe() const { return ""; }
};

class BufferType {
 public:
  virtual ~BufferType() = default;
  virtual std::string_view name() const = 0;
  // Offsets of tensors in buffers of this type are multiples of alignment().
  virtual uint64_t alignment() const = 0;
  virtual bool host_readable() const = 0;
  virtual HighWaterMethod high_water_method() const = 0;
  // Throws [memory] when the bytes cannot be had (mapping refused, no room on the disk).
  virtual std::unique_ptr<Buffer> allocate(Tier tier, uint64_t bytes, const BufferSite& site = {}) const = 0;
};

// Anonymous host RAM, mapped once and sentinel-measured (memory/arena.hpp); 64-byte aligned.
const BufferType& host_arena_buffer_type();
// The same, 4 KiB aligned: the host tier, whose staging buffers the disk tier's file is read
// into and written from with O_DIRECT (the address, offset and length must all be aligned).
const BufferType& host_staging_buffer_type();
// One preallocated file per rank, 4 KiB aligned (ready for O_DIRECT), highest-write measured.
const BufferType& disk_file_buffer_type();
// What a backend without its own memory uses: host arenas for device and host (the host's 4 KiB
// aligned), a file on disk.
const BufferType& default_buffer_type(Tier tier);

}  // namespace memfit
