// CPU quant_linear / quant_linear_backward: dequantise a tile of W into the op's tile workspace
// (threads split it), then one oneDNN product bound at prepare time:
//   forward   per tile of rows of each segment, y[:, r:r+h] = x tile^T (+ bias[r:r+h]), the
//             bias fused as in a plain linear;
//   backward  per tile of columns of all segments stacked, dx[:, c:c+w] (+)= dy tile, each
//             element one fp32 sum over W's rows inside oneDNN: straight into an fp32 dx, or
//             into the fp32 workspace and then rounded once into a bf16 dx (with the op's write
//             mode). Splitting the output, not the sum, spares an fp32 read and write of all of
//             dx per tile and gives the fused q, k, v weight one product per tile instead of a
//             thin one per segment (bench/quant_bench). A taller than wide single weight, or one
//             where fewer than 16 columns fit the tile, takes tiles of rows instead, dx (+)=
//             dy[:, r:r+h] tile, summed over them.
// The products are kernels/quant/cpu_quant_linear.hpp's, with one difference that needs its
// own binding: a segment's rows are a column slice of a wider y, so y's row stride is N, not
// the segment's rows.
#include <map>
#include <memory>
#include <type_traits>

#include "kernels/cpu/cpu_prepare.hpp"
#include "kernels/cpu/elementwise.hpp"
#include "kernels/cpu/matmul.hpp"
#include "kernels/cpu/parallel.hpp"
#include "kernels/quant/blockwise.hpp"
#include "kernels/quant/cpu_quant_linear.hpp"
#include "kernels/quant/quant_segments.hpp"

namespace memfit::cpu {
namespace {

using dt = dnnl::memory::data_type;

// One product per tile, in execution order: rows of one segment, or (the backward) columns of
// every segment, height then all of W's rows.
struct Tile {
  size_t segment = 0;
  int64_t row = 0;    // first row of W (over all segments)
  int64_t local = 0;  // first row inside its segment
  int64_t height = 0;
  int64_t col = 0;    // column tiles: the first column and the width; width 0 for row tiles
  int64_t width = 0;
};
std::vector<Tile> tiles_of(const QuantLinearAttrs& a, bool forward) {
  std::vector<Tile> out;
  // Columns as GradTiles::automatic chooses them, and for a fused weight always (its row tiles
  // would be one thin product per segment).
  const bool by_columns = !forward && (a.k >= a.n || a.segments.size() > 1);
  const int64_t cols = by_columns ? quant_grad_tile_cols(a.n, a.k, a.tile_rows) : 0;
  if (cols > 0) {
    for (int64_t c = 0; c < a.k; c += cols) out.push_back({0, 0, 0, a.n, c, std::min(cols, a.k - c)});
    return out;
  }
  int64_t r0 = 0;
  for (size_t s = 0; s < a.segments.size(); ++s) {
    for (int64_t t = 0; t < a.segments[s]; t += a.tile_rows)
      out.push_back({s, r0 + t, t, std::min(a.tile_rows, a.segments[s] - t), 0, 0});
    r0 += a.segments[s];
  }
  return out;
}

DnnlMatmulSpec product_spec(const QuantLinearAttrs& a, bool forward, const Tile& tile, bool accumulate, bool bias,
                            DType bias_dtype) {
  const dt t = a.compute == DType::bf16 ? dt::bf16 : dt::f32;
  const int64_t h = tile.height, w = tile.width;
  DnnlMatmulSpec s;
  if (w > 0) {
    s.src = DnnlOperand{{a.m, a.n}, {a.n, 1}, t};
    s.wei = DnnlOperand{{a.n, w}, {w, 1}, t};            // the tile: W's columns c .. c + w
    s.dst = DnnlOperand{{a.m, w}, {a.k, 1}, dt::f32};  // the same columns of dx
    s.accumulate = accumulate;
  } else if (forward) {
    s.src = DnnlOperand{{a.m, a.k}, {a.k, 1}, t};
    s.wei = DnnlOperand{{a.k, h}, {1, a.k}, t};  // the tile [h, k], transposed
    s.dst = DnnlOperand{{a.m, h}, {a.n, 1}, t};  // columns r .. r + h of y
    s.bias = bias;
    s.bias_dt = dnnl_type(bias_dtype);
  } else {
    s.src = DnnlOperand{{a.m, h}, {a.n, 1}, t};  // columns r .. r + h of dy
    s.wei = DnnlOperand{{h, a.k}, {a.k, 1}, t};
    s.dst = DnnlOperand{{a.m, a.k}, {a.k, 1}, dt::f32};
    s.accumulate = accumulate;
  }
  return s;
}

// The (height, width, accumulate) variants an op needs. Tiles of columns overwrite their
// columns of dx, or accumulate there (an fp32 dx written in an accumulating mode); tiles of rows
// accumulate into dx but the first, which overwrites or (the same fp32 case) accumulates.
struct Variant {
  int64_t height;
  int64_t width;
  bool accumulate;
  auto operator<=>(const Variant&) const = default;
};

class QuantLinearOp final : public PreparedOp {
 public:
  QuantLinearOp(const DnnlEnv& env, const Program& p, const Op& op, const OpBinding& b)
      : a_(attrs_of<QuantLinearAttrs>(op)), forward_(op.kind == OpKind::quant_linear), mode_(op.modes[0]) {
    const QuantSpec& spec = a_.spec;
    SegmentedStorage st{static_cast<const uint8_t*>(b.inputs[1]), b.inputs[2],
                        a_.spec.double_quant ? static_cast<const float*>(b.inputs[3]) : nullptr,
                        a_.spec.double_quant ? static_cast<const float*>(b.inputs[4]) : nullptr};
    for (size_t s = 0; s < a_.segments.size(); ++s)
      if (a_.piece < 0 || s == size_t(a_.piece)) weights_.push_back(segment_weight(spec, a_.k, a_.segments, s, st));
    offsets_ = st.offset ? st.offset + std::max<int64_t>(a_.piece, 0) : nullptr;
    // From here on the op multiplies its pieces only (a row window: one piece).
    a_.segments = multiplied_segments(a_);
    a_.piece = -1;
    tile_ = b.workspace[0];
    wide_ = !forward_ && a_.compute != DType::f32;
    dx32_ = wide_ ? static_cast<float*>(b.workspace[1]) : nullptr;
    void* scratch = scratch_of(p, op, b);
    const bool bias = forward_ && a_.has_bias;
    const DType bias_dtype = bias ? dtype_of(p, op.inputs.back()) : DType::f32;
    const size_t ebytes = a_.compute == DType::bf16 ? 2 : 4;
    const auto* in = static_cast<const std::byte*>(b.inputs[0]);
    auto* out = static_cast<std::byte*>(b.outputs[0]);
    const bool may_accumulate = !forward_ && !wide_ && mode_ != WriteMode::overwrite;
    for (const Tile& t : tiles_of(a_, forward_)) {
      Step step;
      step.tile = t;
      auto bind = [&](bool acc) {
        DnnlMatmul*& mm = products_[{t.height, t.width, acc}];
        if (!mm) {
          owned_.push_back(std::make_unique<DnnlMatmul>(env, product_spec(a_, forward_, t, acc, bias, bias_dtype)));
          mm = owned_.back().get();
        }
        if (forward_)
          return std::pair{mm, mm->bind(in, tile_, bias ? static_cast<const std::byte*>(b.inputs.back()) +
                                                              size_t(t.row) * dtype_bytes(bias_dtype, 1)
                                                        : nullptr,
                                        out + size_t(t.row) * ebytes, scratch)};
        // dx is fp32 here (the op's fp32 dx or the workspace).
        float* dx = (wide_ ? dx32_ : static_cast<float*>(b.outputs[0])) + t.col;
        return std::pair{mm, mm->bind(in + size_t(t.row) * ebytes, tile_, nullptr, dx, scratch)};
      };
      const bool first = steps_.empty(), columns = t.width > 0;
      std::tie(step.product, step.index) = bind(!forward_ && !columns && !first);
      if ((first || columns) && may_accumulate) std::tie(step.product_acc, step.index_acc) = bind(true);
      steps_.push_back(step);
    }
    out_ = b.outputs[0];
  }

  void run(const StepContext& ctx) override {
    if (a_.compute == DType::bf16) return run_t<bf16_t>(ctx);
    run_t<float>(ctx);
  }

 private:
  struct Step {
    Tile tile;
    DnnlMatmul* product = nullptr;
    int index = -1;
    DnnlMatmul* product_acc = nullptr;  // where the op's mode accumulates into an fp32 dx
    int index_acc = -1;
  };

  template <class T>
  void run_t(const StepContext& ctx) {
    const bool acc = accumulates(mode_, ctx);
    // The double-quantisation offset is a value, read when the op runs: the storage is only
    // filled (initialised, loaded, resumed) after the program is prepared.
    if (offsets_)
      for (size_t s = 0; s < weights_.size(); ++s) weights_[s].offset = offsets_[s];
    T* tile = static_cast<T*>(tile_);
    for (const Step& s : steps_) {
      if (s.tile.width > 0) {
        const std::span<T> cols(tile, size_t(a_.n * s.tile.width));
        dequantize_columns<T>(weights_, s.tile.col, s.tile.width, cols);
        if constexpr (std::is_same_v<T, float>) round_to_weight_dtype(a_.weight_dtype, cols);
      } else {
        const QuantizedWeight& w = weights_[s.tile.segment];
        const int64_t base = s.tile.local * a_.k;
        parallel_for(s.tile.height * a_.k, kParallelGrain, [&](int64_t begin, int64_t end) {
          const std::span<T> part(tile + begin, size_t(end - begin));
          dequantize_range<T>(w, base + begin, base + end, part);
          if constexpr (std::is_same_v<T, float>) round_to_weight_dtype(a_.weight_dtype, part);
        });
      }
      if (acc && s.product_acc) s.product_acc->execute(s.index_acc);
      else s.product->execute(s.index);
    }
    if (wide_) accumulate_forward(dx32_, static_cast<T*>(out_), a_.m * a_.k, acc);
  }

  QuantLinearAttrs a_;
  bool forward_;
  WriteMode mode_;
  bool wide_ = false;
  void* tile_ = nullptr;
  float* dx32_ = nullptr;
  void* out_ = nullptr;
  std::vector<QuantizedWeight> weights_;
  const float* offsets_ = nullptr;  // double quantisation: one per segment
  std::vector<std::unique_ptr<DnnlMatmul>> owned_;
  std::map<Variant, DnnlMatmul*> products_;
  std::vector<Step> steps_;
};

}  // namespace

uint64_t quant_linear_scratch_bytes(const DnnlEnv& env, const Program& p, const Op& op) {
  QuantLinearAttrs a = attrs_of<QuantLinearAttrs>(op);
  a.segments = multiplied_segments(a);
  const bool forward = op.kind == OpKind::quant_linear, bias = forward && a.has_bias;
  const DType bias_dtype = bias ? dtype_of(p, op.inputs.back()) : DType::f32;
  uint64_t most = 0;
  std::map<Variant, bool> seen;
  for (const Tile& t : tiles_of(a, forward))
    for (bool acc : {false, true}) {
      if (forward && acc) continue;
      if (seen.emplace(Variant{t.height, t.width, acc}, true).second)
        most = std::max(most, DnnlMatmul::scratch_bytes(env, product_spec(a, forward, t, acc, bias, bias_dtype)));
    }
  return most;
}

Prepared prepare_quant_linear(const DnnlEnv& env, const Program& p, const Op& op, const OpBinding& b) {
  const QuantLinearAttrs& a = attrs_of<QuantLinearAttrs>(op);
  if (a.compute != DType::f32 && a.compute != DType::bf16) no_cpu_kernel(op, a.compute);
  return std::make_unique<QuantLinearOp>(env, p, op, b);
}

}  // namespace memfit::cpu
