// The one bounded host buffer through which train/ moves tensor contents bigger than a
// scalar (initialisation, loading and saving weights, checkpoint rank files, state scans), and
// the chunked fp32 conversions that use it. train/ never holds an address into a tier: a tier
// may be a disk file or GPU memory, so every byte goes through Executor::read / write.
// Invariant: a TensorStaging is allocated once, before the first step, and never grows, so
// moving a tensor of any size costs at most its fixed size in host memory.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>

#include "runtime/executor.hpp"

namespace memfit {

class TensorStaging {
 public:
  static constexpr size_t kElements = size_t(1) << 18;  // per region: 1 MiB of fp32

  // Left uninitialised: a region costs resident memory only once a caller first uses it.
  TensorStaging() : storage_(std::make_unique_for_overwrite<float[]>(3 * kElements)) {}
  TensorStaging(const TensorStaging&) = delete;
  TensorStaging& operator=(const TensorStaging&) = delete;

  // fp32 values a caller produces or consumes (a chunk of a parameter).
  std::span<float> values() { return {storage_.get(), kElements}; }
  // A second fp32 region for callers that reorder (GPT-2's transposed Conv1D weights).
  std::span<float> gather() { return {storage_.get() + kElements, kElements}; }
  // Bytes the conversions below pass through; a caller may use it only between their calls.
  std::span<std::byte> raw() {
    return std::as_writable_bytes(std::span<float>(storage_.get() + 2 * kElements, kElements));
  }

 private:
  std::unique_ptr<float[]> storage_;
};

// Elements [first, first + values.size()) of a float tensor (fp32, bf16, fp16) set to `values`
// rounded to its dtype, through `raw` in chunks.
void write_fp32(Executor& ex, TensorId id, int64_t first, std::span<const float> values, std::span<std::byte> raw);
// Elements [first, first + out.size()) of a float tensor, widened to fp32, through `raw`.
void read_fp32(const Executor& ex, TensorId id, int64_t first, std::span<float> out, std::span<std::byte> raw);
// Bytes [byte_offset, byte_offset + bytes) of a tensor set to zero (zeroes `raw`).
void zero_bytes(Executor& ex, TensorId id, uint64_t byte_offset, uint64_t bytes, std::span<std::byte> raw);

// Calls fn(offset, chunk) for the tensor's bytes [0, bytes) in order, each chunk read into `raw`.
template <typename Fn>
void for_each_chunk(const Executor& ex, TensorId id, uint64_t bytes, std::span<std::byte> raw, Fn&& fn) {
  for (uint64_t at = 0; at < bytes; at += raw.size()) {
    const std::span<std::byte> chunk = raw.first(size_t(std::min<uint64_t>(raw.size(), bytes - at)));
    ex.read(id, at, chunk);
    fn(at, std::span<const std::byte>(chunk));
  }
}

}  // namespace memfit
