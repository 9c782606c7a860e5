// The int8 wire format of ZeRO++'s quantised weight gather (qwZ, graph/zero.hpp): each rank
// codes its parameter shard blockwise before the all-gather, and every rank decodes the
// gathered blocks into the compute-dtype weights. Symmetric absmax per block:
//   scale = absmax / 127 (fp32), code = round-to-even(x * (127 / absmax)) clamped to +-127,
//   value = code * scale, rounded once to the output type.
// A block whose absmax is 0 codes to zeros; one holding inf or NaN gets scale NaN, so its
// decoded values are NaN (never a silently finite weight). The wire of n elements is n int8
// codes, then n / block fp32 scales (op.hpp, comm_wire_bytes); n is a multiple of block.
// Elements outside `valid` (ZeRO's padding, whose bytes nobody writes) count as 0 and code to
// 0, so padding can neither enlarge a block's scale nor carry NaN into it.
// The functions allocate nothing; they split blocks over threads with parallel_for.
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "kernels/backend.hpp"

namespace memfit::cpu {

using ValidRanges = std::span<const std::pair<int64_t, int64_t>>;  // (first, count), ascending

// Calls fn(first, last) for each piece of [lo, hi) that lies in a valid range, in order (the
// coders of qwZ and qgZ skip ZeRO's padding, whose bytes nobody writes).
template <class Fn>
void for_valid(ValidRanges valid, int64_t lo, int64_t hi, Fn&& fn) {
  auto it = std::upper_bound(valid.begin(), valid.end(), lo,
                             [](int64_t v, const std::pair<int64_t, int64_t>& r) { return v < r.first + r.second; });
  for (; it != valid.end() && it->first < hi; ++it) {
    const int64_t a = std::max(lo, it->first), b = std::min(hi, it->first + it->second);
    if (a < b) fn(a, b);
  }
}

template <class T>
void comm_quantize_int8(const T* x, int64_t n, int64_t block, ValidRanges valid, uint8_t* wire);
// ranks wires of n / ranks elements each, one after another, decoded into out[0, n).
template <class T>
void comm_dequantize_int8(const uint8_t* wire, int64_t n, int64_t block, int ranks, T* out);

std::unique_ptr<PreparedOp> prepare_comm_codec(const Program& p, const Op& op, const OpBinding& b);

}  // namespace memfit::cpu
