// The wire of ZeRO++'s quantised gradient reduce-scatter (qgZ, graph/zero_qgz.cpp): a rank codes
// its gradient bucket as one part per destination of an all-to-all, and each destination sums
// the parts it receives in fp32. Symmetric absmax per block, like qwZ's (comm_codec.hpp):
//   q = 2^(bits-1) - 1 (127 or 7), scale = absmax / q (fp32),
//   code = round-to-even(x * (q / absmax)) clamped to +-q, value = code * scale,
// so |x - value| <= scale / 2. A part of n elements is its codes (int8, or int4 stored as
// code + 8, two a byte, the even element in the low nibble), then ceil(n / block) fp32 scales:
// qgz_wire_bytes (graph/op.hpp). A block whose absmax is 0 codes to zeros; one holding inf or
// NaN gets scale NaN, so its decoded values, and every sum they enter, are NaN (an fp16
// overflow still reaches check_finite). Elements outside `valid` (ZeRO's padding, whose bytes
// nobody writes) count as 0.
// Part d of the wire holds the chunks k * parts + d (chunk elements each, k = 0 .. per part - 1)
// of x, in that order: the first hop sends each node-local destination the shards it will
// forward across nodes, contiguous.
// The functions allocate nothing; they split blocks over threads with parallel_for.
#pragma once

#include <cstdint>
#include <span>
#include <utility>

#include "kernels/backend.hpp"

namespace memfit::cpu {

struct GradWire {
  int64_t n = 0;      // elements of x
  int parts = 1;      // destinations
  int64_t chunk = 0;  // elements per chunk; n is a multiple of parts * chunk
  int64_t block = 256;
  int bits = 8;
  int64_t part_elements() const { return n / parts; }
};

template <class T>
void grad_quantize(const T* x, const GradWire& w, std::span<const std::pair<int64_t, int64_t>> valid, uint8_t* wire);
// ranks parts of n elements each (qgz_wire_bytes apart), summed in fp32 into out[0, n).
template <class T>
void grad_dequantize_sum(const uint8_t* wire, int64_t n, int ranks, int64_t block, int bits, T* out);

std::unique_ptr<PreparedOp> prepare_grad_codec(const Program& p, const Op& op, const OpBinding& b);

}  // namespace memfit::cpu
