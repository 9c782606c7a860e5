#include "train/tensor_staging.hpp"

#include <algorithm>
#include <cstring>

#include "core/error.hpp"
#include "core/half.hpp"

namespace memfit {

void write_fp32(Executor& ex, TensorId id, int64_t first, std::span<const float> values, std::span<std::byte> raw) {
  const DType dt = ex.program().tensor(id).dtype;
  if (dt == DType::f32) return ex.write_as<float>(id, first, values);
  const bool ok = visit_float_type(dt, [&](auto tag) {
    using T = decltype(tag);
    const std::span<T> narrowed(reinterpret_cast<T*>(raw.data()), raw.size() / sizeof(T));
    for (size_t done = 0; done < values.size();) {
      const size_t n = std::min(narrowed.size(), values.size() - done);
      for (size_t i = 0; i < n; ++i) narrowed[i] = narrow<T>(values[done + i]);
      ex.write_as<T>(id, first + int64_t(done), std::span<const T>(narrowed.first(n)));
      done += n;
    }
  });
  MEMFIT_CHECK(ok, "train", "tensor '{}' has dtype {}, which has no fp32 values", ex.program().tensor(id).name,
               dtype_name(dt));
}

void read_fp32(const Executor& ex, TensorId id, int64_t first, std::span<float> out, std::span<std::byte> raw) {
  const DType dt = ex.program().tensor(id).dtype;
  if (dt == DType::f32) return ex.read_as<float>(id, first, out);
  const bool ok = visit_float_type(dt, [&](auto tag) {
    using T = decltype(tag);
    const std::span<T> stored(reinterpret_cast<T*>(raw.data()), raw.size() / sizeof(T));
    for (size_t done = 0; done < out.size();) {
      const size_t n = std::min(stored.size(), out.size() - done);
      ex.read_as<T>(id, first + int64_t(done), stored.first(n));
      for (size_t i = 0; i < n; ++i) out[done + i] = widen(stored[i]);
      done += n;
    }
  });
  MEMFIT_CHECK(ok, "train", "tensor '{}' has dtype {}, which has no fp32 values", ex.program().tensor(id).name,
               dtype_name(dt));
}

void zero_bytes(Executor& ex, TensorId id, uint64_t byte_offset, uint64_t bytes, std::span<std::byte> raw) {
  const std::span<const std::byte> zeros = raw.first(size_t(std::min<uint64_t>(raw.size(), bytes)));
  std::memset(raw.data(), 0, zeros.size());  // no more of the staging touched than needed
  for (uint64_t done = 0; done < bytes; done += zeros.size())
    ex.write(id, byte_offset + done, zeros.first(size_t(std::min<uint64_t>(zeros.size(), bytes - done))));
}

}  // namespace memfit
