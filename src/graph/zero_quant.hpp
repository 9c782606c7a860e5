// ZeRO++ qwZ's pieces of the ZeRO pass (see zero.hpp): the uint8 wire of one quantised gather
// and the ops that code this rank's shard into it and decode the gathered wire. Internal to
// graph/zero*.cpp.
#pragma once

#include <string>

#include "graph/zero.hpp"

namespace memfit {

struct QwzGather {
  TensorId wire = kNoTensor;  // the gathered wire: data-degree x comm_wire_bytes(shard) bytes
  TensorId mine = kNoTensor;  // this rank's block of it, written by `quantize`
  Op quantize, dequantize;    // shard -> mine; wire -> the gather buffer
};

// The wire tensors and codec ops of gathering bucket bi's `shard` into `gathered`; `name`
// names the gather ("zero.all_gather.h3.forward"). Adds tensors to p, no ops.
QwzGather qwz_gather(Program& p, const ZeroLayout& L, size_t bi, TensorId shard, TensorId gathered,
                     const std::string& name);

}  // namespace memfit
