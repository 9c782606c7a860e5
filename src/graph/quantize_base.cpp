#include "graph/quantize_base.hpp"

#include <algorithm>

#include "core/error.hpp"
#include "graph/quant_layout.hpp"

namespace memfit {

namespace {

QuantSpec spec_of(const BaseQuantPolicy& q) {
  const QuantKind kind = q.kind == BaseQuant::fp4 ? QuantKind::fp4 : q.kind == BaseQuant::int8 ? QuantKind::int8 : QuantKind::nf4;
  return QuantSpec{kind, q.block, q.double_quant};
}

// Embeddings and the output head are read by the embedding and classifier ops, never as the
// B of a linear; bnb keeps them unquantised too.
bool is_linear_weight(const Program& p, const ParamEntry& e) {
  if (e.value == kNoTensor || p.tensor(e.value).shape.rank() != 2 || !e.name.ends_with(".weight")) return false;
  for (const char* table : {"wte.weight", "wpe.weight", "embed_tokens.weight", "lm_head.weight"})
    if (e.name == table) return false;
  return true;
}

class QuantizeBase final : public ForwardRewrite {
 public:
  QuantizeBase(const BaseQuantPolicy& q, DType compute) : q_(q), compute_(compute) {
    check_quant_spec(spec_of(q));
  }
  std::string name() const override { return "quantize-base"; }

  void declare(GraphBuilder& b) override {
    weights_.clear();
    Program& p = b.program();
    for (size_t i = 0; i < p.params().size(); ++i) {
      if (!p.params()[i].frozen() || !is_linear_weight(p, p.params()[i])) continue;
      const std::vector<int64_t> segments = hf_segments_of(p, p.params()[i]);
      const TensorId w = p.params()[i].value;
      const Shape ws = p.tensor(w).shape;
      const std::string name = p.params()[i].name;
      QuantizedParam qp{spec_of(q_), compute_, ws[0], ws[1], segments, w};
      const QuantStorage s = segmented_quant_storage(qp.spec, ws[1], segments);
      b.set_layer(p.tensor(w).layer);
      TensorDesc& codes = p.tensor(w);
      codes.name = name + ".codes";
      codes.dtype = qp.spec.kind == QuantKind::int8 ? DType::i8 : DType::nf4;  // keeps the logical shape
      codes.requires_grad = false;
      qp.scales = b.persistent(name + ".scales", Shape{int64_t(q_.double_quant ? s.absmax : s.absmax / 4)},
                               Category::parameters, q_.double_quant ? DType::u8 : DType::f32);
      std::vector<StoredTensor> storage{{ParamRole::codes, w}, {ParamRole::scales, qp.scales}};
      if (q_.double_quant) {
        qp.scales2 = b.persistent(name + ".scales2", Shape{int64_t(s.absmax2 / 4)}, Category::parameters);
        qp.offset = b.persistent(name + ".offset", Shape{int64_t(s.offset / 4)}, Category::parameters);
        storage.push_back({ParamRole::scales2, qp.scales2});
        storage.push_back({ParamRole::offset, qp.offset});
      }
      ParamEntry& e = p.params()[i];  // after declaring: persistent() may grow the tensor table only
      e.value = kNoTensor;
      e.storage = std::move(storage);
      weights_[w] = std::move(qp);
    }
  }

  bool rewrite(const Op& op, GraphBuilder& b) override {
    if (op.kind == OpKind::dora_norm) return rewrite_dora_norm(op, b);
    if (op.kind != OpKind::matmul || op.inputs.size() < 2) return false;
    const auto it = weights_.find(op.inputs[1]);
    if (it == weights_.end()) return false;
    const QuantizedParam& qp = it->second;
    const MatmulAttrs& m = std::get<MatmulAttrs>(op.attrs);
    const int64_t piece = piece_at(qp, m);
    MEMFIT_CHECK(m.trans_b && !m.trans_a && m.alpha == 1.0f && m.k == qp.cols && (m.n == qp.rows || piece >= 0),
                 "graph", "op '{}' reads quantised weight {} other than as x W^T", op.name,
                 b.program().tensor(qp.codes).name);
    QuantLinearAttrs a;
    a.m = m.m, a.n = m.n, a.k = m.k;
    a.piece = piece;
    a.spec = qp.spec;
    a.has_bias = op.inputs.size() > 2;
    const int64_t tallest = piece >= 0 ? m.n : *std::max_element(qp.segments.begin(), qp.segments.end());
    a.tile_rows = quant_tile_rows(tallest, qp.cols);
    a.compute = compute_;
    a.weight_dtype = compute_;
    a.segments = qp.segments;
    std::vector<TensorId> inputs{op.inputs[0], qp.codes, qp.scales};
    if (qp.spec.double_quant) inputs.insert(inputs.end(), {qp.scales2, qp.offset});
    if (a.has_bias) inputs.push_back(op.inputs[2]);
    const TensorId tile = b.transient(op.name + ".tile", Shape{a.tile_rows, a.k}, Category::temporaries);
    // Dequantising costs a few operations per element of W, next to 2 m per element of the product.
    const double flops = op.flops + 4.0 * double(a.n) * double(a.k);
    b.emit({OpKind::quant_linear, op.name, std::move(inputs), op.outputs, std::move(a), flops, op.modes, {tile}});
    return true;
  }

 private:
  // The piece a window of W's rows is (MatmulAttrs::b_offset: DoRA's product of one piece of a
  // fused weight, with dropout), or -1 for the whole weight.
  static int64_t piece_at(const QuantizedParam& qp, const MatmulAttrs& m) {
    if (!m.b_window) return -1;
    for (int64_t s = 0, row = 0; s < int64_t(qp.segments.size()); row += qp.segments[size_t(s)], ++s)
      if (row * qp.cols == m.b_offset && qp.segments[size_t(s)] == m.n) return s;
    MEMFIT_CHECK(false, "graph", "rows [{}, {}) of a quantised weight are not one of its pieces", m.b_offset / qp.cols,
                 m.b_offset / qp.cols + m.n);
    return -1;
  }

  // QDoRA: DoRA's norm reads the weight's pieces as its quantised product does.
  bool rewrite_dora_norm(const Op& op, GraphBuilder& b) {
    const auto it = weights_.find(op.inputs[0]);
    if (it == weights_.end()) return false;
    const QuantizedParam& qp = it->second;
    DoraNormAttrs a = std::get<DoraNormAttrs>(op.attrs);
    a.quantized = true;
    a.spec = qp.spec;
    a.segments = qp.segments;
    a.weight_dtype = compute_;
    std::vector<TensorId> inputs{qp.codes, qp.scales};
    if (qp.spec.double_quant) inputs.insert(inputs.end(), {qp.scales2, qp.offset});
    inputs.insert(inputs.end(), {op.inputs[1], op.inputs[2]});
    const double flops = op.flops + 4.0 * double(a.rows) * double(a.k);  // and the dequantisation
    b.emit({OpKind::dora_norm, op.name, std::move(inputs), op.outputs, std::move(a), flops, op.modes});
    return true;
  }

  BaseQuantPolicy q_;
  DType compute_;
  std::map<TensorId, QuantizedParam> weights_;  // by codes tensor (the weight's old id)
};

}  // namespace

std::vector<int64_t> hf_segments_of(const Program& p, const ParamEntry& e) {
  const Shape s = e.value != kNoTensor ? p.tensor(e.value).shape : p.tensor(e.stored(ParamRole::codes)).shape;
  const std::string fused = "self_attn.qkv_proj.weight";
  if (!e.name.ends_with(fused)) return {s[0]};
  const std::string o_name = e.name.substr(0, e.name.size() - fused.size()) + "self_attn.o_proj.weight";
  for (const ParamEntry& o : p.params()) {
    if (o.name != o_name) continue;
    const TensorId id = o.value != kNoTensor ? o.value : o.stored(ParamRole::codes);
    const int64_t q = p.tensor(id).shape[1], kv = (s[0] - q) / 2;
    MEMFIT_ASSERT(q > 0 && kv > 0 && q + 2 * kv == s[0], "{}: {} rows are not q {} + 2 kv", e.name, s[0], q);
    return {q, kv, kv};
  }
  MEMFIT_ASSERT(false, "{} has no o_proj beside it", e.name);
  return {};
}

QuantizedParam quantized_param_of(const Program& p, const ParamEntry& e) {
  QuantizedParam qp;
  const TensorId codes = e.stored(ParamRole::codes);
  if (codes == kNoTensor) return qp;
  for (const Op& op : p.ops()) {
    if (op.kind != OpKind::quant_linear || op.inputs[1] != codes) continue;
    const auto& a = std::get<QuantLinearAttrs>(op.attrs);
    if (a.piece >= 0) continue;  // a window of the weight's rows
    qp.spec = a.spec, qp.weight_dtype = a.weight_dtype;
    qp.rows = a.n, qp.cols = a.k, qp.segments = a.segments;
    qp.codes = codes;
    qp.scales = e.stored(ParamRole::scales);
    qp.scales2 = e.stored(ParamRole::scales2);
    qp.offset = e.stored(ParamRole::offset);
    return qp;
  }
  MEMFIT_ASSERT(false, "quantised parameter {} is read by no quant_linear op", e.name);
  return qp;
}

int64_t quant_tile_rows(int64_t rows, int64_t cols) {
  // About 4 Mi elements (8 MiB in bf16): a tile of a few dozen rows made each product a thin
  // GEMM and cost two parallel regions per few dozen rows (TinyLlama's QLoRA step spent most
  // of its time at OpenMP barriers), and the input gradient, which accumulates over tiles,
  // needs ~1000-row tiles to come within 10% of one plain product (bench/quant_bench).
  // Rows in multiples of 16 keep the GEMM's blocking whole.
  constexpr int64_t kTileElements = int64_t(4) << 20;
  const int64_t want = std::max<int64_t>(16, kTileElements / std::max<int64_t>(cols, 1) / 16 * 16);
  return std::clamp<int64_t>(want, 1, std::max<int64_t>(rows, 1));
}

std::shared_ptr<ForwardRewrite> make_quantize_base_pass(const BaseQuantPolicy& q, DType compute) {
  return std::make_shared<QuantizeBase>(q, compute);
}

}  // namespace memfit
