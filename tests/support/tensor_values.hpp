// Tests read and write tensors the way train/ does, through Executor::read / write (a tier
// need not be host memory), into vectors of their own. These copy whole tensors and allocate:
// for checks between steps, never inside one. No test needs a tensor's address: the executor
// gives none out.
#pragma once

#include <cstddef>
#include <span>
#include <vector>

#include "runtime/executor.hpp"

namespace memfit {

namespace test {

// The tensor's elements as T (its bytes must be a whole number of T).
template <typename T>
std::vector<T> tensor_values(const Executor& ex, TensorId id) {
  std::vector<T> out(ex.program().tensor(id).bytes() / sizeof(T));
  ex.read_as<T>(id, std::span<T>(out));
  return out;
}

inline std::vector<std::byte> tensor_bytes(const Executor& ex, TensorId id) { return tensor_values<std::byte>(ex, id); }

template <typename T>
void set_tensor_values(Executor& ex, TensorId id, std::span<const T> values) {
  ex.write_as<T>(id, values);
}

}  // namespace test
}  // namespace memfit
