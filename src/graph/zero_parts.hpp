// Pieces of the ZeRO pass (zero.cpp) and its ZeRO++ parts (zero_quant, zero_hpz, zero_qgz) that
// read the program and the layout but none of the pass's state. Internal to graph/zero*.cpp.
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "graph/zero.hpp"

namespace memfit {

// Per bucket, the first op of `ops` (numbered as p's sections number them) in pass 0 (forward),
// 1 (backward and recompute) or 2 (eval) that reads one of its parameters' values; -1 where
// that pass reads none.
std::vector<int> bucket_first_uses(const Program& p, const ZeroLayout& L, const std::vector<Op>& ops, size_t pass);

// Byte offsets in a bytes bucket (ZeroBucket::bytes) of each of e's stored tensors, in the order
// of e.storage, the first at `first`; and the bytes they take there, with alignment.
std::vector<int64_t> stored_part_offsets(const Program& p, const ParamEntry& e, int64_t first);
int64_t stored_parts_span(const Program& p, const ParamEntry& e);
// Stage 3, bytes bucket bi (first byte of e's parts at `first`): this rank's bytes of each of e's
// stored tensors, as views of its shard `shard_root` in the tensor's dtype, into
// e.storage_shard. Parts and shards start at multiples of kStoredPartAlign bytes, so no element
// (a 4-bit code pair, an fp32 scale) straddles two ranks.
void shard_stored_tensors(Program& p, const ZeroLayout& L, size_t bi, TensorId shard_root, ParamEntry& e,
                          int64_t first);

// The fill that zeroes bucket b's unused tail in its gradient bucket `grad_root` (after its last
// parameter), so reductions never read stale bytes; nullopt when the parameters fill the bucket.
std::optional<Op> bucket_padding_fill(Program& p, const ZeroBucket& b, TensorId grad_root);

// The element ranges of bucket b inside [lo, hi) that hold parameter values, as (first, count)
// relative to lo, ascending: the padding after each parameter and at the bucket's end is never
// written, so qwZ's and qgZ's coders must not read it.
std::vector<std::pair<int64_t, int64_t>> bucket_value_ranges(const Program& p, const ZeroBucket& b, int64_t lo,
                                                             int64_t hi);

// A transient communication buffer of `elements` (ZeRO++'s wires, partial sums, secondaries).
TensorId add_comm_buffer(Program& p, std::string name, int64_t elements, DType dtype, int layer);

// The global gradient norm over gradient pieces (ZeRO's shards, or tensor parallelism's
// slices): the pieces' sum of squares (the unsharded norm op's workspace, resized), its
// all_reduce over `group` ("zero.all_reduce.grad_norm"), and the square root.
std::vector<Op> sharded_norm_ops(Program& p, const Op& norm, const std::vector<TensorId>& grads, CollectiveAttrs group);

// A ZeRO++ coder op (comm_quantize / comm_dequantize, grad_quantize / grad_dequantize_sum):
// one input, one output it overwrites, in the communication phase.
Op codec_op(OpKind kind, std::string name, int layer, TensorId in, TensorId out, CommQuantAttrs a, double flops);

}  // namespace memfit
