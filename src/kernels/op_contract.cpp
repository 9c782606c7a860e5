// The op contract (see op_contract.hpp): one check function per family of kinds, each reading
// shapes from the program and attributes from the op, as graph/op.hpp writes them.
#include "kernels/op_contract.hpp"

#include <algorithm>

#include "kernels/quant/quant_segments.hpp"

namespace memfit {
namespace {

bool is_float(DType t) { return t == DType::f32 || t == DType::bf16 || t == DType::f16; }

[[noreturn]] void wrong_dtype(const Program& p, const Op& op, TensorId id, std::string_view want) {
  throw Error("kernels", fmt::format("op '{}' ({}): tensor '{}' is {}; the op contract needs {}", op.name,
                                     op_kind_name(op.kind), p.tensor(id).name, dtype_name(p.tensor(id).dtype), want));
}

// Float slots hold fp32, bf16 or fp16, except the integer token/target inputs and adamw8bit's
// uint8 codes; uint8 workspace is library scratch (runtime/compile.cpp), bytes without a type.
void check_slot_dtypes(const Program& p, const Op& op) {
  if (op.kind == OpKind::quant_linear || op.kind == OpKind::quant_linear_backward) return;  // check_quant_linear
  if (op.kind == OpKind::dora_norm && std::get<DoraNormAttrs>(op.attrs).quantized) return;  // check_dora
  if (op.kind == OpKind::comm_quantize || op.kind == OpKind::comm_dequantize) return;  // check_comm_codec
  if (op.kind == OpKind::grad_quantize || op.kind == OpKind::grad_dequantize_sum) return;  // check_grad_codec
  auto int_input = [&](size_t i) {
    switch (op.kind) {
      case OpKind::embedding_forward:
      case OpKind::embedding_at: return i == 0;
      case OpKind::embedding_backward: return i == 1;
      case OpKind::classifier:
      case OpKind::classifier_eval:
      case OpKind::classifier_partial:
      case OpKind::classifier_parallel_backward: return i == 2;
      default: return false;
    }
  };
  for (size_t i = 0; i < op.inputs.size(); ++i) {
    const DType t = p.tensor(op.inputs[i]).dtype;
    if (int_input(i) ? t != DType::i32 : !is_float(t))
      wrong_dtype(p, op, op.inputs[i], int_input(i) ? "int32" : "a float type");
  }
  // adamw8bit's outputs [targets, m codes, v codes, m absmax, v absmax]: the codes are uint8.
  auto code_output = [&](size_t j) {
    return op.kind == OpKind::adamw8bit && j >= op.outputs.size() / 5 && j < 3 * (op.outputs.size() / 5);
  };
  for (size_t j = 0; j < op.outputs.size(); ++j) {
    const TensorId id = op.outputs[j];
    if (id == kNoTensor) continue;
    const DType t = p.tensor(id).dtype;
    if (code_output(j) ? t != DType::u8 : !is_float(t))
      wrong_dtype(p, op, id, code_output(j) ? "uint8" : "a float type");
  }
  for (TensorId id : op.workspace)
    if (p.tensor(id).dtype != DType::f32 && p.tensor(id).dtype != DType::u8) wrong_dtype(p, op, id, "fp32 or uint8");
}

// The qwZ wire: a float tensor of whole blocks on one side, its uint8 wire(s) on the other.
void check_comm_codec(const Program& p, const Op& op) {
  check_arity(op, 1, 1);
  require_overwrite(op, 0);
  const bool q = op.kind == OpKind::comm_quantize;
  const TensorDesc& x = p.tensor(q ? op.inputs[0] : op.outputs[0]);
  const TensorDesc& wire = p.tensor(q ? op.outputs[0] : op.inputs[0]);
  if (!is_float(x.dtype)) wrong_dtype(p, op, q ? op.inputs[0] : op.outputs[0], "a float type");
  if (wire.dtype != DType::u8) wrong_dtype(p, op, q ? op.outputs[0] : op.inputs[0], "uint8");
  const CommQuantAttrs& a = attrs_of<CommQuantAttrs>(op);
  const int ranks = q ? 1 : a.ranks;
  MEMFIT_CHECK(a.block > 0 && ranks > 0 && x.numel() % (a.block * ranks) == 0, "kernels",
               "op '{}': {} elements are not whole blocks of {} from {} ranks", op.name, x.numel(), a.block, ranks);
  MEMFIT_CHECK(wire.bytes() == ranks * comm_wire_bytes(x.numel() / ranks, a.block), "kernels",
               "op '{}': wire '{}' has {} bytes, not the {} of {} elements", op.name, wire.name, wire.bytes(),
               ranks * comm_wire_bytes(x.numel() / ranks, a.block), x.numel());
  int64_t end = 0;
  for (const auto& [first, count] : a.valid) {
    MEMFIT_CHECK(first >= end && count > 0 && first + count <= x.numel(), "kernels",
                 "op '{}': valid range ({}, {}) overlaps, is empty or lies outside {} elements", op.name, first, count,
                 x.numel());
    end = first + count;
  }
}

// qgZ's wire: a float tensor on one side, `ranks` parts of its uint8 wire on the other.
void check_grad_codec(const Program& p, const Op& op) {
  check_arity(op, 1, 1);
  require_overwrite(op, 0);
  const bool q = op.kind == OpKind::grad_quantize;
  const TensorDesc& x = p.tensor(q ? op.inputs[0] : op.outputs[0]);
  const TensorDesc& wire = p.tensor(q ? op.outputs[0] : op.inputs[0]);
  if (!is_float(x.dtype)) wrong_dtype(p, op, q ? op.inputs[0] : op.outputs[0], "a float type");
  if (wire.dtype != DType::u8) wrong_dtype(p, op, q ? op.outputs[0] : op.inputs[0], "uint8");
  const CommQuantAttrs& a = attrs_of<CommQuantAttrs>(op);
  MEMFIT_CHECK(a.block > 0 && a.ranks > 0 && (a.bits == 8 || (a.bits == 4 && a.block % 2 == 0)), "kernels",
               "op '{}': blocks of {} at {} bits from {} ranks", op.name, a.block, a.bits, a.ranks);
  MEMFIT_CHECK(!q || (a.chunk > 0 && x.numel() % (a.chunk * a.ranks) == 0), "kernels",
               "op '{}': {} elements are not {} parts of whole {}-element chunks", op.name, x.numel(), a.ranks, a.chunk);
  const int64_t part = q ? x.numel() / a.ranks : x.numel();
  MEMFIT_CHECK(wire.bytes() == uint64_t(a.ranks) * qgz_wire_bytes(part, a.block, a.bits), "kernels",
               "op '{}': wire '{}' has {} bytes, not {} parts of {} elements", op.name, wire.name, wire.bytes(),
               a.ranks, part);
}

// The table's rows need not cover every token id: a sliced table (EmbeddingAttrs) holds one
// rank's part of the vocabulary, and the kernels check each token against the rows they have.
void check_embedding(const Program& p, const Op& op) {
  MEMFIT_CHECK(std::holds_alternative<NoAttrs>(op.attrs) || std::holds_alternative<EmbeddingAttrs>(op.attrs),
               "kernels", "op '{}' ({}) takes NoAttrs or EmbeddingAttrs", op.name, op_kind_name(op.kind));
  MEMFIT_CHECK(embedding_slice(op).vocab_begin >= 0, "kernels", "op '{}': vocabulary slice begins at {}", op.name,
               embedding_slice(op).vocab_begin);
  if (op.kind == OpKind::embedding_forward) {
    const bool has_wpe = op.inputs.size() == 3;  // rotary models have no position table
    check_arity(op, has_wpe ? 3 : 2, 1);
    const TensorDesc& tokens = p.tensor(op.inputs[0]);
    const TensorDesc& wte = p.tensor(op.inputs[1]);
    const int64_t seq = tokens.shape.last();
    if (has_wpe) {
      MEMFIT_CHECK(p.tensor(op.inputs[2]).shape.rows() >= seq, "kernels", "op '{}': wpe has fewer rows than T={}",
                   op.name, seq);
      require_dtype(p, op, op.inputs[2], wte.dtype);
    }
    check_numel(p, op, op.outputs[0], tokens.numel() * wte.shape.last(), "x");
    require_dtype(p, op, op.outputs[0], wte.dtype);
    return;
  }
  const bool has_wpe = op.outputs.size() == 2;
  check_arity(op, 2, has_wpe ? 2 : 1);
  const TensorDesc& tokens = p.tensor(op.inputs[1]);
  const int64_t N = tokens.numel(), seq = tokens.shape.last(), C = p.tensor(op.inputs[0]).shape.last();
  check_numel(p, op, op.inputs[0], N * C, "dx");
  const TensorId dwpe = has_wpe ? op.outputs[1] : kNoTensor;
  MEMFIT_CHECK(dwpe == kNoTensor || p.tensor(dwpe).shape.rows() >= seq, "kernels",
               "op '{}': dwpe has fewer rows than T={}", op.name, seq);
  MEMFIT_CHECK(op.outputs[0] != kNoTensor || dwpe != kNoTensor, "kernels", "op '{}' has no output", op.name);
  const DType g = op.outputs[0] != kNoTensor ? dtype_of(p, op.outputs[0]) : dtype_of(p, dwpe);
  for (TensorId id : op.outputs) require_dtype(p, op, id, g);
}

// layernorm and rmsnorm: in [x, w, (b)] out [y, (mean), rstd]; backward in [dy, x, w, (mean), rstd]
// out [dx, dw, (db)]. Statistics are fp32; dw and db share one gradient dtype.
void check_norm(const Program& p, const Op& op) {
  const bool layer = op.kind == OpKind::layernorm_forward || op.kind == OpKind::layernorm_backward;
  const bool fwd = op.kind == OpKind::layernorm_forward || op.kind == OpKind::rmsnorm_forward;
  const size_t stats = layer ? 2 : 1, weights = layer ? 2 : 1;
  if (fwd) {
    check_arity(op, 1 + weights, 1 + stats);
    MEMFIT_CHECK(op.outputs[0] != kNoTensor, "kernels", "op '{}': {} needs its output y", op.name,
                 op_kind_name(op.kind));
    const TensorDesc& x = p.tensor(op.inputs[0]);
    const int64_t C = x.shape.last(), N = x.numel() / C;
    for (size_t i = 1; i <= weights; ++i) check_numel(p, op, op.inputs[i], C, i == 1 ? "w" : "b");
    check_numel(p, op, op.outputs[0], N * C, "y");
    for (size_t j = 1; j <= stats; ++j) check_numel(p, op, op.outputs[j], N, j == stats ? "rstd" : "mean");
    for (size_t j = 0; j <= stats; ++j) require_overwrite(op, j);
    for (size_t i = 1; i <= weights; ++i) require_dtype(p, op, op.inputs[i], x.dtype);
    require_dtype(p, op, op.outputs[0], x.dtype);
    for (size_t j = 1; j <= stats; ++j) require_dtype(p, op, op.outputs[j], DType::f32);
    return;
  }
  check_arity(op, 3 + stats, 1 + weights);
  const TensorDesc& x = p.tensor(op.inputs[1]);
  const int64_t C = x.shape.last(), N = x.numel() / C;
  check_numel(p, op, op.inputs[0], N * C, "dy");
  check_numel(p, op, op.inputs[2], C, "w");
  for (size_t i = 3; i < 3 + stats; ++i) check_numel(p, op, op.inputs[i], N, i + 1 == 3 + stats ? "rstd" : "mean");
  check_numel(p, op, op.outputs[0], N * C, "dx");
  for (size_t j = 1; j <= weights; ++j) check_numel(p, op, op.outputs[j], C, j == 1 ? "dw" : "db");
  for (size_t i : {0, 2}) require_dtype(p, op, op.inputs[i], x.dtype);
  for (size_t i = 3; i < 3 + stats; ++i) require_dtype(p, op, op.inputs[i], DType::f32);
  require_dtype(p, op, op.outputs[0], x.dtype);
  const TensorId first_grad = op.outputs[1] != kNoTensor || !layer ? op.outputs[1] : op.outputs[2];
  const DType g = dtype_of(p, first_grad);
  for (size_t j = 1; j <= weights; ++j) require_dtype(p, op, op.outputs[j], g);
}

// Elementwise kinds: every tensor has the output's element count. add, gelu and swiglu keep one
// dtype throughout; accumulate and cast go between any two float types.
void check_pointwise(const Program& p, const Op& op) {
  size_t inputs = 1, outputs = 1;
  if (op.kind == OpKind::add || op.kind == OpKind::gelu_backward || op.kind == OpKind::swiglu_forward) inputs = 2;
  if (op.kind == OpKind::swiglu_backward) inputs = 3, outputs = 2;
  check_arity(op, inputs, outputs);
  const bool swiglu = op.kind == OpKind::swiglu_forward || op.kind == OpKind::swiglu_backward;
  const TensorId ref = swiglu ? op.inputs[op.kind == OpKind::swiglu_forward ? 0 : 1] : op.outputs[0];
  const int64_t n = p.tensor(ref).numel();
  const DType dt = p.tensor(ref).dtype;
  const bool one_dtype = op.kind != OpKind::accumulate && op.kind != OpKind::cast;
  for (TensorId id : op.inputs) {
    check_numel(p, op, id, n, "input");
    if (one_dtype) require_dtype(p, op, id, dt);
  }
  for (TensorId id : op.outputs) {
    check_numel(p, op, id, n, "result");
    if (one_dtype) require_dtype(p, op, id, dt);
  }
  if (op.kind == OpKind::swiglu_forward) require_overwrite(op, 0);
}

// add_columns / slice_columns: a column block of a [rows, cols] tensor; one dtype throughout.
void check_columns(const Program& p, const Op& op) {
  const bool add = op.kind == OpKind::add_columns;
  check_arity(op, add ? 2 : 1, 1);
  const ColumnsAttrs a = std::get<ColumnsAttrs>(op.attrs);
  MEMFIT_CHECK(a.rows > 0 && a.width > 0 && a.begin >= 0 && a.begin + a.width <= a.cols, "kernels",
               "op '{}': column block [{}, {}) outside {} columns", op.name, a.begin, a.begin + a.width, a.cols);
  const TensorId wide = add ? op.outputs[0] : op.inputs[0];
  const TensorId block = add ? op.inputs[1] : op.outputs[0];
  check_numel(p, op, wide, a.rows * a.cols, "wide tensor");
  check_numel(p, op, block, a.rows * a.width, "column block");
  if (add) check_numel(p, op, op.inputs[0], a.rows * a.cols, "a");
  const DType dt = p.tensor(wide).dtype;
  for (TensorId id : op.inputs) require_dtype(p, op, id, dt);
  require_dtype(p, op, op.outputs[0], dt);
}

void check_dropout(const Program& p, const Op& op) {
  check_arity(op, 1, 1);
  const DropoutAttrs a = std::get<DropoutAttrs>(op.attrs);
  MEMFIT_CHECK(a.p > 0 && a.p < 1, "kernels", "op '{}': dropout probability {} outside (0, 1)", op.name, a.p);
  check_numel(p, op, op.inputs[0], p.tensor(op.outputs[0]).numel(), "input");
  require_dtype(p, op, op.inputs[0], p.tensor(op.outputs[0]).dtype);
}

void check_matmul(const Program& p, const Op& op) {
  MEMFIT_CHECK((op.inputs.size() == 2 || op.inputs.size() == 3) && op.outputs.size() == 1, "kernels",
               "op '{}' (matmul) needs inputs [A, B, (bias)] and output [C]", op.name);
  const MatmulAttrs& a = attrs_of<MatmulAttrs>(op);
  check_numel(p, op, op.inputs[0], a.m * a.k, "A");
  if (!a.b_window) {
    check_numel(p, op, op.inputs[1], a.k * a.n, "B");
  } else {  // whole rows of a larger B: K-long rows stored [N,K] (trans_b), N-long ones stored [K,N]
    const int64_t row = a.trans_b ? a.k : a.n, numel = p.tensor(op.inputs[1]).numel();
    MEMFIT_CHECK(a.b_offset >= 0 && a.b_offset % row == 0 && numel % row == 0 && a.b_offset + a.k * a.n <= numel,
                 "kernels", "op '{}' (matmul): B '{}' of {} elements has no window of {} x {} at element {}", op.name,
                 p.tensor(op.inputs[1]).name, numel, a.n, a.k, a.b_offset);
  }
  if (op.inputs.size() == 3) check_numel(p, op, op.inputs[2], a.n, "bias");
  check_numel(p, op, op.outputs[0], a.m * a.n, "C");
}

// quant_linear: in [x, codes, scales, (scales2, offset), (bias)] out [y] workspace [tile (+ scratch)];
// backward in [dy, codes, scales, (scales2, offset)] out [dx] workspace [tile, (dx fp32), (+ scratch)].
// The storage sizes are those of the segmented format (kernels/quant/quant_segments.hpp).
void check_quant_linear(const Program& p, const Op& op) {
  const QuantLinearAttrs& a = attrs_of<QuantLinearAttrs>(op);
  const bool fwd = op.kind == OpKind::quant_linear;
  const size_t storage = a.spec.double_quant ? 4 : 2;
  const bool wide = !fwd && a.compute != DType::f32;
  const bool scratch = !op.workspace.empty() && p.tensor(op.workspace.back()).dtype == DType::u8;
  check_arity(op, 1 + storage + (fwd && a.has_bias ? 1 : 0), 1, 1 + (wide ? 1 : 0) + (scratch ? 1 : 0));
  MEMFIT_CHECK(a.compute == DType::f32 || a.compute == DType::bf16, "kernels",
               "op '{}': quantised products compute in fp32 or bf16, not {}", op.name, dtype_name(a.compute));
  MEMFIT_CHECK(a.piece < int64_t(a.segments.size()), "kernels", "op '{}': piece {} of a weight of {} pieces", op.name,
               a.piece, a.segments.size());
  int64_t rows = 0;
  for (int64_t r : multiplied_segments(a)) rows += r;
  MEMFIT_CHECK(!a.segments.empty() && rows == a.n && a.tile_rows >= 1, "kernels",
               "op '{}': segments of {} rows for a weight of {} rows", op.name, rows, a.n);
  const QuantSpec& spec = a.spec;
  const QuantStorage q = segmented_quant_storage(spec, a.k, a.segments);
  auto bytes = [&](size_t i, uint64_t want, const char* what) {
    MEMFIT_CHECK(p.tensor(op.inputs[i]).bytes() == want, "kernels", "op '{}': {} '{}' has {} bytes, the format needs {}",
                 op.name, what, p.tensor(op.inputs[i]).name, p.tensor(op.inputs[i]).bytes(), want);
  };
  bytes(1, q.codes, "codes");
  bytes(2, q.absmax, "scales");
  require_dtype(p, op, op.inputs[2], a.spec.double_quant ? DType::u8 : DType::f32);
  if (a.spec.double_quant) {
    bytes(3, q.absmax2, "scales2");
    bytes(4, q.offset, "offset");
    require_dtype(p, op, op.inputs[3], DType::f32);
    require_dtype(p, op, op.inputs[4], DType::f32);
  }
  const TensorId in = op.inputs[0], out = op.outputs[0];
  check_numel(p, op, in, a.m * (fwd ? a.k : a.n), fwd ? "x" : "dy");
  check_numel(p, op, out, a.m * (fwd ? a.n : a.k), fwd ? "y" : "dx");
  require_dtype(p, op, in, a.compute);
  require_dtype(p, op, out, a.compute);
  if (fwd && a.has_bias) {
    check_numel(p, op, op.inputs.back(), a.n, "bias");
    require_dtype(p, op, op.inputs.back(), a.compute);
  }
  if (fwd) require_overwrite(op, 0);
  check_numel(p, op, op.workspace[0], std::min(a.tile_rows, a.n) * a.k, "tile");
  require_dtype(p, op, op.workspace[0], a.compute);
  if (wide) {
    check_numel(p, op, op.workspace[1], a.m * a.k, "dx fp32");
    require_dtype(p, op, op.workspace[1], DType::f32);
  }
}

void check_bias_grad(const Program& p, const Op& op) {
  check_arity(op, 1, 1);
  const int64_t N = p.tensor(op.outputs[0]).numel(), M = p.tensor(op.inputs[0]).numel() / std::max<int64_t>(N, 1);
  check_numel(p, op, op.inputs[0], M * N, "dy");
}

// rope writes over its input in the program (y may be x); an accumulating backward is refused:
// the gradient of qkv is always made by this op alone.
void check_rope(const Program& p, const Op& op) {
  check_arity(op, 1, 1);
  require_overwrite(op, 0);
  const AttentionAttrs& a = attrs_of<AttentionAttrs>(op);
  const int64_t kv = a.kv_heads > 0 ? a.kv_heads : a.heads;
  check_numel(p, op, op.inputs[0], a.batch * a.seq * (a.heads + 2 * kv) * a.head_dim, "qkv");
  check_numel(p, op, op.outputs[0], p.tensor(op.inputs[0]).numel(), "result");
  require_dtype(p, op, op.outputs[0], p.tensor(op.inputs[0]).dtype);
}

void check_attention(const Program& p, const Op& op) {
  const AttentionAttrs& a = attrs_of<AttentionAttrs>(op);
  const int64_t B = a.batch, T = a.seq, NH = a.heads, C = a.heads * a.head_dim;
  const int64_t qkv = B * T * (a.heads + 2 * (a.kv_heads > 0 ? a.kv_heads : a.heads)) * a.head_dim;
  const bool plain = op.kind == OpKind::attention_forward || op.kind == OpKind::attention_backward;
  const bool fwd = op.kind == OpKind::attention_forward || op.kind == OpKind::flash_attention_forward;
  // Every tensor has qkv's storage type, except the fp32 lse and workspace.
  check_arity(op, fwd ? 1 : plain ? 3 : 4, fwd ? 2 : 1, !fwd && plain ? 1 : 0);
  const DType dt = dtype_of(p, op.inputs[fwd ? 0 : 1]);
  const TensorId lse = op.kind == OpKind::flash_attention_forward    ? op.outputs.at(1)
                       : op.kind == OpKind::flash_attention_backward ? op.inputs.at(3)
                                                                     : kNoTensor;
  if (fwd) {
    check_numel(p, op, op.inputs[0], qkv, "qkv");
    check_numel(p, op, op.outputs[0], B * T * C, "y");  // plain: y may be absent (probabilities recomputed)
    if (plain) {
      MEMFIT_CHECK(op.outputs[1] != kNoTensor, "kernels", "op '{}': attention needs its probs output", op.name);
      check_numel(p, op, op.outputs[1], B * NH * T * T, "probs");
      require_overwrite(op, 1);
    } else {
      MEMFIT_CHECK(op.outputs[0] != kNoTensor && op.outputs[1] != kNoTensor, "kernels",
                   "op '{}': flash attention needs both outputs y and lse", op.name);
      check_numel(p, op, lse, B * NH * T, "lse");
      require_overwrite(op, 0);
      require_overwrite(op, 1);
    }
  } else {
    check_numel(p, op, op.inputs[0], B * T * C, "dy");
    check_numel(p, op, op.inputs[1], qkv, "qkv");
    if (plain) {
      check_numel(p, op, op.inputs[2], B * NH * T * T, "probs");
      check_numel(p, op, op.workspace[0], B * NH * T * T, "dprobs");
      require_dtype(p, op, op.workspace[0], DType::f32);
    } else {
      check_numel(p, op, op.inputs[2], B * T * C, "y");
      check_numel(p, op, lse, B * NH * T, "lse");
    }
    check_numel(p, op, op.outputs[0], qkv, "dqkv");
  }
  for (const auto* list : {&op.inputs, &op.outputs})
    for (TensorId id : *list)
      if (id != kNoTensor) require_dtype(p, op, id, id == lse ? DType::f32 : dt);
}

// The generation kinds (graph/op.hpp): the position is a run-time value, so p + T against the
// position table and the cache rows is the kernels' check; here only the shapes.
void check_generation(const Program& p, const Op& op) {
  if (op.kind == OpKind::embedding_at) {
    const bool has_wpe = op.inputs.size() == 3;
    check_arity(op, has_wpe ? 3 : 2, 1);
    require_overwrite(op, 0);
    const TensorDesc& wte = p.tensor(op.inputs[1]);
    check_numel(p, op, op.outputs[0], p.tensor(op.inputs[0]).numel() * wte.shape.last(), "x");
    if (has_wpe) check_numel(p, op, op.inputs[2], p.tensor(op.inputs[2]).shape.rows() * wte.shape.last(), "wpe");
    for (TensorId id : {op.outputs[0], has_wpe ? op.inputs[2] : kNoTensor}) require_dtype(p, op, id, wte.dtype);
    return;
  }
  check_arity(op, 1, 3);
  const CachedAttentionAttrs& c = attrs_of<CachedAttentionAttrs>(op);
  const AttentionAttrs& a = c.attn;
  const int64_t kv = a.kv_heads > 0 ? a.kv_heads : a.heads;
  MEMFIT_CHECK(a.head_dim > 0 && a.head_dim <= 512 && kv > 0 && a.heads % kv == 0 && (!c.rope || a.head_dim % 2 == 0),
               "kernels", "op '{}': head_dim {} (even with rope, at most 512), {} heads over {} kv heads", op.name,
               a.head_dim, a.heads, kv);
  MEMFIT_CHECK(a.seq >= 1 && a.seq <= c.capacity, "kernels", "op '{}': {} tokens for a cache of {} positions", op.name,
               a.seq, c.capacity);
  check_numel(p, op, op.inputs[0], a.batch * a.seq * (a.heads + 2 * kv) * a.head_dim, "qkv");
  check_numel(p, op, op.outputs[0], a.batch * a.seq * a.heads * a.head_dim, "y");
  for (size_t j = 1; j < 3; ++j) {
    check_numel(p, op, op.outputs[j], a.batch * kv * c.capacity * a.head_dim, j == 1 ? "k cache" : "v cache");
    MEMFIT_CHECK(op.outputs[j] != kNoTensor && op.modes[j] == WriteMode::update, "kernels",
                 "op '{}': the caches are updated in place (rows before the position are read)", op.name);
  }
  require_overwrite(op, 0);
  for (TensorId id : op.outputs) require_dtype(p, op, id, p.tensor(op.inputs[0]).dtype);
}

// add_bias: y (M, N) = x + b per row; one dtype throughout.
void check_add_bias(const Program& p, const Op& op) {
  check_arity(op, 2, 1);
  const int64_t n = p.tensor(op.inputs[1]).numel(), numel = p.tensor(op.inputs[0]).numel();
  MEMFIT_CHECK(n > 0 && numel % n == 0, "kernels", "op '{}': x of {} elements is not rows of the bias's {}", op.name,
               numel, n);
  check_numel(p, op, op.outputs[0], numel, "y");
  for (TensorId id : {op.inputs[1], op.outputs[0]}) require_dtype(p, op, id, p.tensor(op.inputs[0]).dtype);
}

// adamw: outputs [targets, m, v] fp32 (16-bit parameters are updated through their fp32
// masters); adamw8bit: [targets, m codes, v codes, m absmax, v absmax].
void check_update(const Program& p, const Op& op) {
  const bool eight = op.kind == OpKind::adamw8bit;
  const AdamWAttrs& a = attrs_of<AdamWAttrs>(op);
  const size_t n = update_op_tensors(op, a, eight ? 5 : 3);
  MEMFIT_CHECK(a.weight_decay.empty() || a.weight_decay.size() == n, "kernels",
               "op '{}' ({}): {} weight decays for {} tensors", op.name, op_kind_name(op.kind),
               a.weight_decay.size(), n);
  MEMFIT_CHECK(!eight || a.block >= 1, "kernels", "op '{}' (adamw8bit): block size {}", op.name, a.block);
  for (TensorId id : op.outputs)
    MEMFIT_CHECK(id != kNoTensor, "kernels", "op '{}' ({}): every parameter and state tensor must be present", op.name,
                 op_kind_name(op.kind));
  for (size_t i = 0; i < n; ++i) {
    const int64_t numel = p.tensor(op.inputs[i]).numel();
    for (size_t k = 0; k < 3; ++k) check_numel(p, op, op.outputs[i + k * n], numel, "param/m/v");
    if (!eight)
      for (size_t k = 0; k < 3; ++k) require_dtype(p, op, op.outputs[i + k * n], DType::f32);
    const int64_t blocks = eight ? (numel + a.block - 1) / a.block : 0;
    if (eight)
      for (size_t k = 3; k < 5; ++k) check_numel(p, op, op.outputs[i + k * n], blocks, "absmax");
  }
  if (a.max_grad_norm > 0) check_numel(p, op, op.inputs.back(), 1, "norm");
}

void check_reduction(const Program& p, const Op& op) {
  switch (op.kind) {
    case OpKind::grad_norm: {
      const bool sqrt_form = attrs_of<GradNormAttrs>(op).form == GradNormAttrs::Form::sqrt_of_input;
      check_arity(op, sqrt_form ? 1 : op.inputs.size(), 1, sqrt_form ? 0 : 1);
      if (sqrt_form) check_numel(p, op, op.inputs[0], 1, "sum of squares");
      check_numel(p, op, op.outputs[0], 1, "norm");
      require_overwrite(op, 0);
      return;
    }
    case OpKind::check_finite:
      check_arity(op, op.inputs.size(), 1);
      check_numel(p, op, op.outputs[0], 1, "flag");
      require_dtype(p, op, op.outputs[0], DType::f32);
      require_overwrite(op, 0);
      return;
    case OpKind::loss_mean:
      check_arity(op, 1, 1);
      check_numel(p, op, op.outputs[0], 1, "loss");
      require_dtype(p, op, op.inputs[0], DType::f32);
      require_dtype(p, op, op.outputs[0], DType::f32);
      return;
    default: return;
  }
}

}  // namespace

[[noreturn]] void no_kernel(std::string_view backend, const Op& op, DType dtype) {
  throw Error("kernels", fmt::format("no {} kernel for {} ({}) yet (op '{}')", backend, op_kind_name(op.kind),
                                     dtype_name(dtype), op.name));
}

void check_arity(const Op& op, size_t inputs, size_t outputs, size_t workspace) {
  MEMFIT_CHECK(op.inputs.size() == inputs && op.outputs.size() == outputs && op.workspace.size() >= workspace,
               "kernels", "op '{}' ({}) has {} inputs, {} outputs and {} workspace tensors; expected {}, {} and {}",
               op.name, op_kind_name(op.kind), op.inputs.size(), op.outputs.size(), op.workspace.size(), inputs,
               outputs, workspace);
}

void check_numel(const Program& program, const Op& op, TensorId id, int64_t numel, const char* what) {
  if (id == kNoTensor) return;
  MEMFIT_CHECK(program.tensor(id).numel() == numel, "kernels", "op '{}' ({}): {} '{}' has {} elements, expected {}",
               op.name, op_kind_name(op.kind), what, program.tensor(id).name, program.tensor(id).numel(), numel);
}

void require_dtype(const Program& p, const Op& op, TensorId id, DType want) {
  if (id != kNoTensor && p.tensor(id).dtype != want) wrong_dtype(p, op, id, dtype_name(want));
}

void require_overwrite(const Op& op, size_t j) {
  MEMFIT_CHECK(op.modes[j] == WriteMode::overwrite, "kernels", "op '{}' ({}) can only overwrite output {}", op.name,
               op_kind_name(op.kind), j);
}

size_t update_op_tensors(const Op& op, const AdamWAttrs& a, size_t roles) {
  const size_t n = op.outputs.size() / roles;
  MEMFIT_CHECK(op.outputs.size() % roles == 0, "kernels", "op '{}' ({}) has {} outputs, not {} per tensor", op.name,
               op_kind_name(op.kind), op.outputs.size(), roles);
  check_arity(op, n + (a.max_grad_norm > 0 ? 1 : 0), roles * n);
  return n;
}

EmbeddingSlice embedding_slice(const Op& op) {
  if (std::holds_alternative<NoAttrs>(op.attrs)) return {};
  const EmbeddingAttrs& a = attrs_of<EmbeddingAttrs>(op);
  return EmbeddingSlice{a.vocab_begin, a.add_positions, true};
}

bool writes_nothing(const Op& op) {
  return op.kind != OpKind::fill &&
         std::none_of(op.outputs.begin(), op.outputs.end(), [](TensorId id) { return id != kNoTensor; });
}

void check_binding(const Op& op, const OpBinding& binding) {
  MEMFIT_CHECK(binding.inputs.size() == op.inputs.size() && binding.outputs.size() == op.outputs.size() &&
                   binding.workspace.size() == op.workspace.size(),
               "kernels", "op '{}': the binding has {}/{}/{} inputs/outputs/workspace entries for {}/{}/{} tensors",
               op.name, binding.inputs.size(), binding.outputs.size(), binding.workspace.size(), op.inputs.size(),
               op.outputs.size(), op.workspace.size());
}

void check_op_contract(const Program& program, const Op& op) {
  MEMFIT_CHECK(op.kind != OpKind::load_input, "kernels",
               "op '{}' (load_input) is run by the executor, not by a backend", op.name);
  check_slot_dtypes(program, op);
  if (writes_nothing(op)) return;
  switch (op.kind) {
    case OpKind::embedding_forward:
    case OpKind::embedding_backward: return check_embedding(program, op);
    case OpKind::layernorm_forward:
    case OpKind::layernorm_backward:
    case OpKind::rmsnorm_forward:
    case OpKind::rmsnorm_backward: return check_norm(program, op);
    case OpKind::gelu_forward:
    case OpKind::gelu_backward:
    case OpKind::swiglu_forward:
    case OpKind::swiglu_backward:
    case OpKind::add:
    case OpKind::accumulate:
    case OpKind::cast: return check_pointwise(program, op);
    case OpKind::add_columns:
    case OpKind::slice_columns: return check_columns(program, op);
    case OpKind::dropout_forward:
    case OpKind::dropout_backward: return check_dropout(program, op);
    case OpKind::dora_norm:
    case OpKind::dora_scale:
    case OpKind::dora_scale_backward:
    case OpKind::dora_blend:
    case OpKind::dora_blend_backward: return check_dora(program, op);
    case OpKind::matmul: return check_matmul(program, op);
    case OpKind::quant_linear:
    case OpKind::quant_linear_backward: return check_quant_linear(program, op);
    case OpKind::bias_grad: return check_bias_grad(program, op);
    case OpKind::rope_forward:
    case OpKind::rope_backward: return check_rope(program, op);
    case OpKind::attention_forward:
    case OpKind::attention_backward:
    case OpKind::flash_attention_forward:
    case OpKind::flash_attention_backward: return check_attention(program, op);
    case OpKind::classifier:
    case OpKind::classifier_eval: return check_classifier(program, op);
    case OpKind::classifier_partial:
    case OpKind::classifier_combine:
    case OpKind::classifier_parallel_backward: return check_classifier_parallel(program, op);
    case OpKind::add_bias: return check_add_bias(program, op);
    case OpKind::adamw:
    case OpKind::adamw8bit: return check_update(program, op);
    case OpKind::grad_norm:
    case OpKind::check_finite:
    case OpKind::loss_mean: return check_reduction(program, op);
    case OpKind::fill: return check_arity(op, 0, 1);
    case OpKind::comm_quantize:
    case OpKind::comm_dequantize: return check_comm_codec(program, op);
    case OpKind::grad_quantize:
    case OpKind::grad_dequantize_sum: return check_grad_codec(program, op);
    case OpKind::embedding_at:
    case OpKind::cached_attention: return check_generation(program, op);
    default: return;  // kinds no backend computes: refused by the backend, naming the op
  }
}

DType op_storage_dtype(const Program& program, const Op& op) {
  for (const auto* list : {&op.outputs, &op.inputs})
    for (TensorId id : *list)
      if (id != kNoTensor && is_float(program.tensor(id).dtype)) return program.tensor(id).dtype;
  return DType::f32;
}

void require_capability(const OpCapabilities& caps, const Program& program, const Op& op) {
  const DType dt = op_storage_dtype(program, op);
  if (!caps.supports(op.kind, dt)) no_kernel(caps.name(), op, dt);
}

}  // namespace memfit
