// Filling the storage of a quantised frozen weight (graph/quantize_base.hpp) from its float
// values, at initialisation and at --load: the values are rounded to the compute dtype first,
// then quantised piece by piece (kernels/quant/quant_segments.hpp) into the codes, scales,
// scales2 and offset. Rounding first is what transformers + bitsandbytes do: a QLoRA model is
// loaded in its compute dtype (dtype=bfloat16 with bnb_4bit_compute_dtype=bfloat16), and
// Params4bit quantises the bf16 weight it holds, whatever dtype the file had.
// Values stream through the run's TensorStaging a chunk of whole blocks at a time, so no copy
// of the weight is made. Only double quantisation holds more: the plain absmax of one piece
// (4 bytes per block, 1/16 of the piece's fp32 size at block 64) and its codes, because the
// offset is the mean over all of them; never inside a step.
#pragma once

#include <functional>
#include <span>

#include "graph/program.hpp"
#include "runtime/executor.hpp"
#include "train/tensor_staging.hpp"

namespace memfit {

// Whether the parameter is stored quantised (codes, no value tensor).
bool is_quantized_param(const ParamEntry& e);

// Elements [first, first + out.size()) of piece `segment` of a quantised parameter (its HF
// tensor: Llama's q, k or v), as fp32 in memfit's row order.
using SegmentValues = std::function<void(size_t segment, int64_t first, std::span<float> out)>;

// Quantises the whole parameter into its storage, asking `values` for chunks of each piece in
// order. The chunks lie in staging.values(); `values` may use staging.gather() but not raw().
void store_quantized_parameter(Executor& ex, const ParamEntry& e, const SegmentValues& values, TensorStaging& staging);

// Elements [first, first + out.size()) of the whole parameter, in memfit's row order.
using ParameterValues = std::function<void(int64_t first, std::span<float> out)>;

// The same, asking for chunks of the whole parameter: initialisation, whose random streams are
// drawn per parameter, not per piece, and can draw any range (no copy of the weight is made).
void store_quantized_parameter(Executor& ex, const ParamEntry& e, const ParameterValues& values,
                               TensorStaging& staging);

// `values` asked for by piece: element `first` of piece s is element (piece s's start + first).
SegmentValues segment_values(const Program& p, const ParamEntry& e, ParameterValues values);

// The rows of piece `segment` of a quantised parameter dequantised as its products see them
// (rounded to the compute dtype), a chunk of whole rows at a time through the staging:
// fn(first row, rows, their values). Throws [train] for a parameter sharded by ZeRO-3.
using DequantizedRows = std::function<void(int64_t first_row, int64_t rows, std::span<const float> values)>;
void read_dequantized_rows(const Executor& ex, const ParamEntry& e, size_t segment, const DequantizedRows& fn,
                           TensorStaging& staging);

// The same from all of the parameter's values at once.
void store_quantized_parameter(Executor& ex, const ParamEntry& e, std::span<const float> values,
                               TensorStaging& staging);

}  // namespace memfit
