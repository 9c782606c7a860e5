#include "train/quantized_weights.hpp"

#include <algorithm>
#include <numeric>
#include <vector>

#include "core/error.hpp"
#include "graph/quantize_base.hpp"
#include "kernels/quant/blockwise.hpp"
#include "kernels/quant/quant_segments.hpp"

namespace memfit {

bool is_quantized_param(const ParamEntry& e) { return e.value == kNoTensor && e.stored(ParamRole::codes) != kNoTensor; }

namespace {

// Byte offsets of one piece's parts in the storage tensors.
struct PieceAt {
  uint64_t codes = 0, scales = 0, scales2 = 0;
};

// Codes and plain absmax of one chunk of whole blocks (the last chunk of a piece may end in a
// partial block: quantize_4bit / quantize_int8 see it as the piece's own partial block).
template <class T>
void quantize_chunk(std::span<const T> in, const QuantSpec& spec, std::span<uint8_t> codes, std::span<float> absmax) {
  if (spec.kind == QuantKind::int8) quantize_int8<T>(in, spec, codes, absmax);
  else quantize_4bit<T>(in, spec, codes, absmax);
}

// Bytes [at, at + data.size()) of e's stored tensor `id`: into the tensor, or at ZeRO stage 3
// (ParamEntry::storage_shard) the part of them that this rank's shard holds.
void write_stored(Executor& ex, const ParamEntry& e, TensorId id, uint64_t at, std::span<const std::byte> data) {
  if (e.storage_shard.empty()) return ex.write(id, at, data);
  for (size_t k = 0; k < e.storage.size(); ++k) {
    if (e.storage[k].id != id) continue;
    const ParamEntry::StoragePiece& piece = e.storage_shard[k];
    const int64_t a = std::max(int64_t(at), piece.first);
    const int64_t b = std::min(int64_t(at + data.size()), piece.first + piece.bytes);
    if (piece.view != kNoTensor && a < b)
      ex.write(piece.view, uint64_t(a - piece.first), data.subspan(size_t(a - int64_t(at)), size_t(b - a)));
    return;
  }
  MEMFIT_ASSERT(false, "tensor {} is not stored by parameter {}", id, e.name);
}

}  // namespace

void store_quantized_parameter(Executor& ex, const ParamEntry& e, const SegmentValues& values, TensorStaging& staging) {
  const Program& p = ex.program();
  const QuantizedParam qp = quantized_param_of(p, e);
  MEMFIT_CHECK(qp.codes != kNoTensor, "train", "parameter '{}' is not stored quantised", e.name);
  MEMFIT_CHECK(dtype_is_float(qp.weight_dtype), "train", "quantised weights rounded to {} before quantising",
               dtype_name(qp.weight_dtype));
  const QuantSpec& spec = qp.spec;
  const bool four_bit = spec.kind != QuantKind::int8;
  // A chunk is whole blocks (blocks are powers of two up to 4096, so the staging holds many).
  const int64_t chunk = int64_t(TensorStaging::kElements) / spec.block * spec.block;
  // raw(): the chunk rounded to bf16, then its codes; gather(): its absmax.
  const std::span<std::byte> raw = staging.raw();
  const std::span<bf16_t> rounded{reinterpret_cast<bf16_t*>(raw.data()), size_t(chunk)};
  const std::span<uint8_t> chunk_codes{reinterpret_cast<uint8_t*>(raw.data()) + rounded.size_bytes(),
                                       size_t(four_bit ? (chunk + 1) / 2 : chunk)};
  MEMFIT_ASSERT(rounded.size_bytes() + chunk_codes.size() <= raw.size(), "staging too small for a chunk");
  std::vector<float> absmax;  // double quantisation: the whole piece's plain absmax
  std::vector<uint8_t> absmax_codes;
  std::vector<float> absmax2;
  PieceAt at;
  for (size_t s = 0; s < qp.segments.size(); ++s) {
    const int64_t n = qp.segments[s] * qp.cols;
    const QuantStorage q = quant_storage(spec, n);
    const int64_t blocks = quant_blocks(n, spec.block);
    if (spec.double_quant) absmax.resize(size_t(blocks));
    for (int64_t first = 0; first < n; first += chunk) {
      const int64_t m = std::min(chunk, n - first);
      const std::span<float> in = staging.values().first(size_t(m));
      values(s, first, in);
      const int64_t chunk_blocks = quant_blocks(m, spec.block), block0 = first / spec.block;
      const std::span<float> chunk_absmax = spec.double_quant
                                                ? std::span<float>(absmax).subspan(size_t(block0), size_t(chunk_blocks))
                                                : staging.gather().first(size_t(chunk_blocks));
      const std::span<uint8_t> codes = chunk_codes.first(size_t(four_bit ? (m + 1) / 2 : m));
      if (qp.weight_dtype == DType::bf16) {
        for (int64_t i = 0; i < m; ++i) rounded[size_t(i)] = round_to_bf16(in[size_t(i)]);
        quantize_chunk<bf16_t>(rounded.first(size_t(m)), spec, codes, chunk_absmax);
      } else {
        // An fp16 model's weights are fp16 values (exact in fp32), as bnb quantises them.
        if (qp.weight_dtype == DType::f16)
          for (float& v : in) v = widen(narrow<fp16_t>(v));
        quantize_chunk<float>(in, spec, codes, chunk_absmax);
      }
      write_stored(ex, e, qp.codes, at.codes + uint64_t(four_bit ? first / 2 : first), std::as_bytes(codes));
      if (!spec.double_quant)
        write_stored(ex, e, qp.scales, at.scales + uint64_t(block0) * sizeof(float), std::as_bytes(chunk_absmax));
    }
    if (spec.double_quant) {
      absmax_codes.resize(size_t(blocks));
      absmax2.resize(size_t(q.absmax2 / sizeof(float)));
      const float offset = double_quantize_absmax(absmax, absmax_codes, absmax2);
      write_stored(ex, e, qp.scales, at.scales, std::as_bytes(std::span<const uint8_t>(absmax_codes)));
      write_stored(ex, e, qp.scales2, at.scales2, std::as_bytes(std::span<const float>(absmax2)));
      write_stored(ex, e, qp.offset, uint64_t(s) * sizeof(float), std::as_bytes(std::span<const float>(&offset, 1)));
    }
    at.codes += q.codes, at.scales += q.absmax, at.scales2 += q.absmax2;
  }
}

SegmentValues segment_values(const Program& p, const ParamEntry& e, ParameterValues values) {
  const QuantizedParam qp = quantized_param_of(p, e);
  std::vector<int64_t> starts{0};  // each piece's first element in the parameter
  for (int64_t rows : qp.segments) starts.push_back(starts.back() + rows * qp.cols);
  return [starts, values = std::move(values)](size_t s, int64_t first, std::span<float> out) {
    values(starts[s] + first, out);
  };
}

void store_quantized_parameter(Executor& ex, const ParamEntry& e, const ParameterValues& values,
                               TensorStaging& staging) {
  store_quantized_parameter(ex, e, segment_values(ex.program(), e, values), staging);
}

void read_dequantized_rows(const Executor& ex, const ParamEntry& e, size_t segment, const DequantizedRows& fn,
                           TensorStaging& staging) {
  const Program& p = ex.program();
  const QuantizedParam qp = quantized_param_of(p, e);
  MEMFIT_CHECK(qp.codes != kNoTensor, "train", "parameter '{}' is not stored quantised", e.name);
  MEMFIT_CHECK(e.storage_shard.empty(), "train", "parameter '{}' is sharded by ZeRO-3: its whole rows cannot be read "
               "here", e.name);
  MEMFIT_ASSERT(segment < qp.segments.size(), "piece {} of {}", segment, e.name);
  const QuantSpec& spec = qp.spec;
  const int64_t cols = qp.cols, rows = qp.segments[segment], n = rows * cols;
  const QuantStorage at = segment_offset(spec, cols, qp.segments, segment);
  // The piece's absmax per block, as block_absmax computes it from the stored statistics.
  const QuantStorage q = quant_storage(spec, n);
  const int64_t blocks = quant_blocks(n, spec.block);
  std::vector<float> absmax(static_cast<size_t>(blocks));
  if (spec.double_quant) {
    std::vector<uint8_t> codes(static_cast<size_t>(blocks));
    std::vector<float> absmax2(static_cast<size_t>(q.absmax2 / 4));
    QuantizedWeight stats;
    stats.spec = spec;
    ex.read(qp.scales, at.absmax, std::as_writable_bytes(std::span<uint8_t>(codes)));
    ex.read(qp.scales2, at.absmax2, std::as_writable_bytes(std::span<float>(absmax2)));
    ex.read(qp.offset, segment * 4, std::as_writable_bytes(std::span<float>(&stats.offset, 1)));
    stats.absmax_codes = codes, stats.absmax2 = absmax2;
    for (int64_t b = 0; b < blocks; ++b) absmax[size_t(b)] = stats.block_absmax(b);
  } else {
    ex.read(qp.scales, at.absmax, std::as_writable_bytes(std::span<float>(absmax)));
  }
  // Chunks of whole rows that start on a block (so a plain view of the chunk sees its blocks).
  const int64_t step = spec.block / std::gcd(spec.block, cols);
  const int64_t fit = int64_t(TensorStaging::kElements) / cols / step * step;
  MEMFIT_CHECK(fit >= 1, "train", "'{}': {} rows of {} do not fit the staging", e.name, step, cols);
  const bool four_bit = spec.kind != QuantKind::int8;
  const std::span<std::byte> raw = staging.raw();
  for (int64_t r0 = 0; r0 < rows; r0 += fit) {
    const int64_t h = std::min(fit, rows - r0), first = r0 * cols, m = h * cols;
    const uint64_t begin = four_bit ? uint64_t(first) / 2 : uint64_t(first);
    const uint64_t bytes = four_bit ? uint64_t(m + 1) / 2 : uint64_t(m);
    ex.read(qp.codes, at.codes + begin, raw.first(size_t(bytes)));
    QuantizedWeight w;
    w.spec = QuantSpec{spec.kind, spec.block, false};
    w.rows = h, w.cols = cols;
    w.codes = {reinterpret_cast<const uint8_t*>(raw.data()), size_t(bytes)};
    w.absmax = std::span<const float>(absmax).subspan(size_t(first / spec.block), size_t(quant_blocks(m, spec.block)));
    const std::span<float> out = staging.values().first(size_t(m));
    dequantize_as_weight(w, 0, m, qp.weight_dtype, {reinterpret_cast<bf16_t*>(staging.gather().data()), size_t(m)}, out);
    fn(r0, h, out);
  }
}

void store_quantized_parameter(Executor& ex, const ParamEntry& e, std::span<const float> values,
                               TensorStaging& staging) {
  const QuantizedParam qp = quantized_param_of(ex.program(), e);
  MEMFIT_CHECK(int64_t(values.size()) == qp.rows * qp.cols, "train", "parameter '{}': {} values for a [{}, {}] weight",
               e.name, values.size(), qp.rows, qp.cols);
  store_quantized_parameter(ex, e, ParameterValues([&](int64_t first, std::span<float> out) {
    std::copy_n(values.begin() + first, out.size(), out.begin());
  }), staging);
}

}  // namespace memfit
