// The CPU backend: turns each op of a program into a PreparedOp bound to fixed addresses.
// prepare() reads shapes from the program and attributes from the op, validates them, builds
// the oneDNN primitives and captures everything a run needs in a closure, so that run() is
// a direct call into a kernel: no lookups, no allocation in memfit code.
//
// Subtle point: write modes are resolved at run time (accumulate_after_first_micro flips
// between micro-steps), so a kernel whose products are oneDNN primitives gets every variant
// its mode can take at prepare time, and scratch_bytes() builds exactly the same set of
// primitive descriptors to size the scratch the plan reserves.
//
// Dtypes: check_dtypes() admits fp32, bf16 and fp16 in every float slot; each prepare
// function then picks its kernel instantiation from the tensors' dtypes (dispatch_t / _tg)
// and refuses, naming the op, a combination it has no kernel for. The precision pass
// (graph/precision.hpp) only emits combinations that exist here.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <utility>

#include "core/error.hpp"
#include "kernels/backend.hpp"
#include "kernels/cpu/adamw.hpp"
#include "kernels/cpu/adamw8bit.hpp"
#include "kernels/cpu/attention.hpp"
#include "kernels/cpu/classifier.hpp"
#include "kernels/cpu/dnnl_matmul.hpp"
#include "kernels/cpu/elementwise.hpp"
#include "kernels/cpu/embedding.hpp"
#include "kernels/cpu/finite.hpp"
#include "kernels/cpu/flash_attention.hpp"
#include "kernels/cpu/gelu.hpp"
#include "core/half.hpp"
#include "kernels/cpu/grad_norm.hpp"
#include "kernels/cpu/layernorm.hpp"
#include "kernels/cpu/matmul.hpp"
#include "kernels/cpu/reduce.hpp"
#include "kernels/cpu/rmsnorm.hpp"
#include "kernels/cpu/rope.hpp"
#include "kernels/cpu/swiglu.hpp"

namespace memfit {
namespace {

template <class Fn>
class ClosureOp final : public PreparedOp {
 public:
  explicit ClosureOp(Fn fn) : fn_(std::move(fn)) {}
  void run(const StepContext& ctx) override { fn_(ctx); }

 private:
  Fn fn_;
};

template <class Fn>
std::unique_ptr<PreparedOp> make_op(Fn fn) {
  return std::make_unique<ClosureOp<Fn>>(std::move(fn));
}

[[noreturn]] void no_kernel(const Op& op, DType dtype) {
  throw Error("kernels", fmt::format("no CPU kernel for {} ({}) yet (op '{}')", op_kind_name(op.kind),
                                     dtype_name(dtype), op.name));
}

bool is_float(DType t) { return t == DType::f32 || t == DType::bf16 || t == DType::f16; }

// Checks the op's tensors are floats (fp32, bf16, fp16), except the integer token/target
// inputs of the kinds that have them; which float combinations exist is each prepare's call.
void check_dtypes(const Program& program, const Op& op) {
  auto int_input = [&](size_t i) {
    switch (op.kind) {
      case OpKind::embedding_forward: return i == 0;
      case OpKind::embedding_backward: return i == 1;
      case OpKind::classifier:
      case OpKind::classifier_eval: return i == 2;
      default: return false;
    }
  };
  for (size_t i = 0; i < op.inputs.size(); ++i) {
    const DType t = program.tensor(op.inputs[i]).dtype;
    if (int_input(i) ? t != DType::i32 : !is_float(t)) no_kernel(op, t);
  }
  // adamw8bit's outputs [targets, m codes, v codes, m absmax, v absmax]: the codes are uint8.
  auto code_output = [&](size_t j) {
    return op.kind == OpKind::adamw8bit && j >= op.outputs.size() / 5 && j < 3 * (op.outputs.size() / 5);
  };
  for (size_t j = 0; j < op.outputs.size(); ++j) {
    const TensorId id = op.outputs[j];
    if (id == kNoTensor) continue;
    const DType t = program.tensor(id).dtype;
    if (code_output(j) ? t != DType::u8 : !is_float(t)) no_kernel(op, t);
  }
  // uint8 workspace is library scratch (runtime/compile.cpp), bytes without a type.
  for (TensorId id : op.workspace)
    if (program.tensor(id).dtype != DType::f32 && program.tensor(id).dtype != DType::u8)
      no_kernel(op, program.tensor(id).dtype);
}

DType dtype_of(const Program& p, TensorId id) { return id == kNoTensor ? DType::f32 : p.tensor(id).dtype; }

// Requires tensor `id` (when present) to have dtype `want`.
void require_dtype(const Program& p, const Op& op, TensorId id, DType want) {
  if (id != kNoTensor && p.tensor(id).dtype != want) no_kernel(op, p.tensor(id).dtype);
}

// Calls fn with a value of the storage type of t: float, bf16_t or fp16_t.
template <class Fn>
void dispatch_t(const Op& op, DType t, Fn&& fn) {
  if (!visit_float_type(t, fn)) no_kernel(op, t);
}
// The same for a (storage, gradient) pair: kernels exist for G = T and for G = float.
template <class Fn>
void dispatch_tg(const Op& op, DType t, DType g, Fn&& fn) {
  dispatch_t(op, t, [&](auto tt) {
    if (g == DType::f32) return fn(tt, float{});
    if (g != t) no_kernel(op, g);
    fn(tt, tt);
  });
}

void check_arity(const Op& op, size_t inputs, size_t outputs, size_t workspace = 0) {
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

// Outputs whose kernels only overwrite (saved statistics, probabilities).
void require_overwrite(const Op& op, size_t j) {
  MEMFIT_CHECK(op.modes[j] == WriteMode::overwrite, "kernels", "op '{}' ({}) can only overwrite output {}", op.name,
               op_kind_name(op.kind), j);
}

template <class A>
const A& attrs_of(const Op& op) {
  const A* a = std::get_if<A>(&op.attrs);
  MEMFIT_CHECK(a, "kernels", "op '{}' ({}) lacks its attributes", op.name, op_kind_name(op.kind));
  return *a;
}

// Library scratch is the op's last workspace tensor, typed uint8 (backend.hpp).
void* scratch_of(const Program& p, const Op& op, const OpBinding& binding) {
  if (!op.workspace.empty() && p.tensor(op.workspace.back()).dtype == DType::u8) return binding.workspace.back();
  return nullptr;
}

const float* in_f(const OpBinding& b, size_t i) { return static_cast<const float*>(b.inputs[i]); }
const int32_t* in_i(const OpBinding& b, size_t i) { return static_cast<const int32_t*>(b.inputs[i]); }
float* out_f(const OpBinding& b, size_t j) { return static_cast<float*>(b.outputs[j]); }
template <class T>
const T* in_t(const OpBinding& b, size_t i) {
  return static_cast<const T*>(b.inputs[i]);
}
template <class T>
T* out_t(const OpBinding& b, size_t j) {
  return static_cast<T*>(b.outputs[j]);
}

// --- shapes and attributes shared by scratch_bytes() and prepare() ---

MatmulAttrs matmul_attrs(const Program& program, const Op& op) {
  MEMFIT_CHECK((op.inputs.size() == 2 || op.inputs.size() == 3) && op.outputs.size() == 1, "kernels",
               "op '{}' (matmul) needs inputs [A, B, (bias)] and output [C]", op.name);
  const MatmulAttrs& a = attrs_of<MatmulAttrs>(op);
  check_numel(program, op, op.inputs[0], a.m * a.k, "A");
  check_numel(program, op, op.inputs[1], a.k * a.n, "B");
  if (op.inputs.size() == 3) check_numel(program, op, op.inputs[2], a.n, "bias");
  check_numel(program, op, op.outputs[0], a.m * a.n, "C");
  return a;
}

// fp32 throughout, or bf16 A and B with a bf16 or fp32 bias and C.
MatmulTypes matmul_types(const Program& p, const Op& op) {
  MatmulTypes t{dtype_of(p, op.inputs[0]), dtype_of(p, op.inputs[1]),
                op.inputs.size() == 3 ? dtype_of(p, op.inputs[2]) : DType::f32, dtype_of(p, op.outputs[0])};
  const bool fp32 = t.a == DType::f32 && t.b == DType::f32 && t.bias == DType::f32 && t.c == DType::f32;
  auto bf16_or_f32 = [](DType x) { return x == DType::bf16 || x == DType::f32; };
  const bool bf16 = t.a == DType::bf16 && t.b == DType::bf16 && bf16_or_f32(t.bias) && bf16_or_f32(t.c);
  if (!fp32 && !bf16) no_kernel(op, t.a == DType::f32 ? t.b : t.a);
  return t;
}

AttentionShape attention_shape(const Program& p, const Op& op) {
  AttentionShape s = AttentionShape::of(attrs_of<AttentionAttrs>(op));
  s.dtype = dtype_of(p, op.inputs[op.kind == OpKind::attention_forward ? 0 : 1]);
  if (s.dtype != DType::f32 && s.dtype != DType::bf16) no_kernel(op, s.dtype);
  for (TensorId id : op.inputs) require_dtype(p, op, id, s.dtype);
  for (TensorId id : op.outputs)
    if (id != kNoTensor) require_dtype(p, op, id, s.dtype);
  if (op.kind == OpKind::attention_backward && !op.workspace.empty()) require_dtype(p, op, op.workspace[0], DType::f32);
  return s;
}

ClassifierShape classifier_shape(const Program& program, const Op& op) {
  const ClassifierAttrs& a = attrs_of<ClassifierAttrs>(op);
  const TensorDesc& wte = program.tensor(op.inputs[1]);
  ClassifierShape s;
  s.rows = a.rows;
  s.channels = wte.shape.last();
  s.vocab = a.vocab;
  s.padded_vocab = wte.shape.rows();
  s.chunk_rows = a.chunk_rows;
  s.dtype = wte.dtype;
  s.grad_dtype = op.kind == OpKind::classifier ? dtype_of(program, op.outputs[2]) : DType::f32;
  require_dtype(program, op, op.inputs[0], s.dtype);
  if (op.kind == OpKind::classifier) require_dtype(program, op, op.outputs[1], s.dtype);
  require_dtype(program, op, op.outputs[0], DType::f32);
  check_numel(program, op, op.inputs[0], s.rows * s.channels, "x");
  check_numel(program, op, op.inputs[2], s.rows, "targets");
  check_numel(program, op, op.outputs[0], s.rows, "losses");
  return s;
}

ClassifierOutputs classifier_outputs(const Op& op) {
  ClassifierOutputs o;
  o.losses = op.outputs[0] != kNoTensor;
  if (op.kind == OpKind::classifier) {
    o.dx = op.outputs[1] != kNoTensor;
    o.dwte = op.outputs[2] != kNoTensor;
    o.dx_modes = WriteVariants::of(op.modes[1]);
    o.dwte_modes = WriteVariants::of(op.modes[2]);
  }
  return o;
}

// --- prepare, one function per kind ---

std::unique_ptr<PreparedOp> prepare_embedding_forward(const Program& p, const Op& op, const OpBinding& b) {
  const bool has_wpe = op.inputs.size() == 3;  // rotary models have no position table
  check_arity(op, has_wpe ? 3 : 2, 1);
  const TensorDesc& tokens = p.tensor(op.inputs[0]);
  const TensorDesc& wte = p.tensor(op.inputs[1]);
  const int64_t N = tokens.numel(), seq = tokens.shape.last(), C = wte.shape.last(), Vp = wte.shape.rows();
  if (has_wpe) {
    MEMFIT_CHECK(p.tensor(op.inputs[2]).shape.rows() >= seq, "kernels", "op '{}': wpe has fewer rows than T={}",
                 op.name, seq);
    require_dtype(p, op, op.inputs[2], wte.dtype);
  }
  check_numel(p, op, op.outputs[0], N * C, "x");
  require_dtype(p, op, op.outputs[0], wte.dtype);
  std::unique_ptr<PreparedOp> out;
  dispatch_t(op, wte.dtype, [&](auto t) {
    using T = decltype(t);
    out = make_op([=, tok = in_i(b, 0), wte = in_t<T>(b, 1), wpe = has_wpe ? in_t<T>(b, 2) : nullptr,
                   x = out_t<T>(b, 0),
                   mode = op.modes[0]](const StepContext& ctx) {
      embedding_forward(tok, wte, wpe, x, N, seq, C, Vp, accumulates(mode, ctx));
    });
  });
  return out;
}

std::unique_ptr<PreparedOp> prepare_embedding_backward(const Program& p, const Op& op, const OpBinding& b) {
  const bool has_wpe = op.outputs.size() == 2;  // rotary models have no position table
  check_arity(op, 2, has_wpe ? 2 : 1);
  const TensorDesc& tokens = p.tensor(op.inputs[1]);
  const int64_t N = tokens.numel(), seq = tokens.shape.last();
  const int64_t C = p.tensor(op.inputs[0]).shape.last();
  check_numel(p, op, op.inputs[0], N * C, "dx");
  const TensorId dwpe_id = has_wpe ? op.outputs[1] : kNoTensor;
  const int64_t Vp = op.outputs[0] != kNoTensor ? p.tensor(op.outputs[0]).shape.rows() : 0;
  const int64_t Tmax = dwpe_id != kNoTensor ? p.tensor(dwpe_id).shape.rows() : 0;
  MEMFIT_CHECK(dwpe_id == kNoTensor || Tmax >= seq, "kernels", "op '{}': dwpe has fewer rows than T={}", op.name, seq);
  MEMFIT_CHECK(op.outputs[0] != kNoTensor || dwpe_id != kNoTensor, "kernels", "op '{}' has no output", op.name);
  const DType g = op.outputs[0] != kNoTensor ? dtype_of(p, op.outputs[0]) : dtype_of(p, dwpe_id);
  for (TensorId id : op.outputs) require_dtype(p, op, id, g);
  std::unique_ptr<PreparedOp> out;
  dispatch_tg(op, dtype_of(p, op.inputs[0]), g, [&](auto t, auto gt) {
    using T = decltype(t);
    using G = decltype(gt);
    out = make_op([=, dx = in_t<T>(b, 0), tok = in_i(b, 1), dwte = out_t<G>(b, 0),
                   dwpe = has_wpe ? out_t<G>(b, 1) : nullptr, m0 = op.modes[0],
                   m1 = has_wpe ? op.modes[1] : WriteMode::overwrite](const StepContext& ctx) {
      embedding_backward(dx, tok, dwte, dwpe, N, seq, C, Vp, Tmax, accumulates(m0, ctx), accumulates(m1, ctx));
    });
  });
  return out;
}

std::unique_ptr<PreparedOp> prepare_rmsnorm_forward(const Program& p, const Op& op, const OpBinding& b) {
  check_arity(op, 2, 2);
  MEMFIT_CHECK(op.outputs[0] != kNoTensor, "kernels", "op '{}': rmsnorm_forward needs its output y", op.name);
  const TensorDesc& x = p.tensor(op.inputs[0]);
  const int64_t C = x.shape.last(), N = x.numel() / C;
  check_numel(p, op, op.inputs[1], C, "w");
  check_numel(p, op, op.outputs[0], N * C, "y");
  check_numel(p, op, op.outputs[1], N, "rstd");
  for (size_t j = 0; j < 2; ++j) require_overwrite(op, j);
  require_dtype(p, op, op.inputs[1], x.dtype);
  require_dtype(p, op, op.outputs[0], x.dtype);
  require_dtype(p, op, op.outputs[1], DType::f32);
  const float eps = attrs_of<NormAttrs>(op).eps;
  std::unique_ptr<PreparedOp> out;
  dispatch_t(op, x.dtype, [&](auto t) {
    using T = decltype(t);
    out = make_op([=, x = in_t<T>(b, 0), w = in_t<T>(b, 1), y = out_t<T>(b, 0), rstd = out_f(b, 1)](
                      const StepContext&) { rmsnorm_forward(x, w, y, rstd, N, C, eps); });
  });
  return out;
}

std::unique_ptr<PreparedOp> prepare_rmsnorm_backward(const Program& p, const Op& op, const OpBinding& b) {
  check_arity(op, 4, 2);
  const TensorDesc& x = p.tensor(op.inputs[1]);
  const int64_t C = x.shape.last(), N = x.numel() / C;
  check_numel(p, op, op.inputs[0], N * C, "dy");
  check_numel(p, op, op.inputs[2], C, "w");
  check_numel(p, op, op.inputs[3], N, "rstd");
  check_numel(p, op, op.outputs[0], N * C, "dx");
  check_numel(p, op, op.outputs[1], C, "dw");
  require_dtype(p, op, op.inputs[0], x.dtype);
  require_dtype(p, op, op.inputs[2], x.dtype);
  require_dtype(p, op, op.inputs[3], DType::f32);
  if (op.outputs[0] != kNoTensor) require_dtype(p, op, op.outputs[0], x.dtype);
  const DType g = op.outputs[1] != kNoTensor ? dtype_of(p, op.outputs[1]) : DType::f32;
  std::unique_ptr<PreparedOp> out;
  dispatch_tg(op, x.dtype, g, [&](auto t, auto gt) {
    using T = decltype(t);
    using G = decltype(gt);
    out = make_op([=, dy = in_t<T>(b, 0), x = in_t<T>(b, 1), w = in_t<T>(b, 2), rstd = in_f(b, 3), dx = out_t<T>(b, 0),
                   dw = out_t<G>(b, 1), m0 = op.modes[0], m1 = op.modes[1]](const StepContext& ctx) {
      rmsnorm_backward(dy, x, w, rstd, dx, dw, N, C, accumulates(m0, ctx), accumulates(m1, ctx));
    });
  });
  return out;
}

std::unique_ptr<PreparedOp> prepare_swiglu(const Program& p, const Op& op, const OpBinding& b) {
  const bool fwd = op.kind == OpKind::swiglu_forward;
  check_arity(op, fwd ? 2 : 3, fwd ? 1 : 2);
  const TensorId gate_id = op.inputs[fwd ? 0 : 1];
  const TensorDesc& gate = p.tensor(gate_id);
  const int64_t n = gate.numel();
  for (TensorId id : op.inputs) {
    check_numel(p, op, id, n, "operand");
    require_dtype(p, op, id, gate.dtype);
  }
  for (TensorId id : op.outputs) {
    check_numel(p, op, id, n, "result");
    require_dtype(p, op, id, gate.dtype);
  }
  if (fwd) require_overwrite(op, 0);
  std::unique_ptr<PreparedOp> out;
  dispatch_t(op, gate.dtype, [&](auto t) {
    using T = decltype(t);
    if (fwd)
      out = make_op([=, g = in_t<T>(b, 0), u = in_t<T>(b, 1), y = out_t<T>(b, 0)](const StepContext&) {
        swiglu_forward(g, u, y, n);
      });
    else
      out = make_op([=, dy = in_t<T>(b, 0), g = in_t<T>(b, 1), u = in_t<T>(b, 2), dg = out_t<T>(b, 0),
                     du = out_t<T>(b, 1), m0 = op.modes[0], m1 = op.modes[1]](const StepContext& ctx) {
        swiglu_backward(dy, g, u, dg, du, n, accumulates(m0, ctx), accumulates(m1, ctx));
      });
  });
  return out;
}

// rope writes over its input (forward and backward are in place in the program), so the
// kernel's y may be x; an accumulating backward is refused: the gradient of qkv is always
// made by this op alone.
std::unique_ptr<PreparedOp> prepare_rope(const Program& p, const Op& op, const OpBinding& b) {
  check_arity(op, 1, 1);
  require_overwrite(op, 0);
  const AttentionAttrs a = attrs_of<AttentionAttrs>(op);
  const int64_t kv = a.kv_heads > 0 ? a.kv_heads : a.heads;
  const TensorDesc& x = p.tensor(op.inputs[0]);
  check_numel(p, op, op.inputs[0], a.batch * a.seq * (a.heads + 2 * kv) * a.head_dim, "qkv");
  check_numel(p, op, op.outputs[0], x.numel(), "result");
  require_dtype(p, op, op.outputs[0], x.dtype);
  const bool fwd = op.kind == OpKind::rope_forward;
  std::unique_ptr<PreparedOp> out;
  dispatch_t(op, x.dtype, [&](auto t) {
    using T = decltype(t);
    out = make_op([=, in = in_t<T>(b, 0), y = out_t<T>(b, 0)](const StepContext&) {
      if (fwd) rope_forward(in, y, a.batch, a.seq, a.heads, kv, a.head_dim, a.rope_theta);
      else rope_backward(in, y, a.batch, a.seq, a.heads, kv, a.head_dim, a.rope_theta);
    });
  });
  return out;
}

std::unique_ptr<PreparedOp> prepare_layernorm_forward(const Program& p, const Op& op, const OpBinding& b) {
  check_arity(op, 3, 3);
  MEMFIT_CHECK(op.outputs[0] != kNoTensor, "kernels", "op '{}': layernorm_forward needs its output y", op.name);
  const TensorDesc& x = p.tensor(op.inputs[0]);
  const int64_t C = x.shape.last(), N = x.numel() / C;
  check_numel(p, op, op.inputs[1], C, "w");
  check_numel(p, op, op.inputs[2], C, "b");
  check_numel(p, op, op.outputs[0], N * C, "y");
  check_numel(p, op, op.outputs[1], N, "mean");
  check_numel(p, op, op.outputs[2], N, "rstd");
  for (size_t j = 0; j < 3; ++j) require_overwrite(op, j);
  for (size_t i = 1; i < 3; ++i) require_dtype(p, op, op.inputs[i], x.dtype);
  require_dtype(p, op, op.outputs[0], x.dtype);
  require_dtype(p, op, op.outputs[1], DType::f32);
  require_dtype(p, op, op.outputs[2], DType::f32);
  const float eps = attrs_of<NormAttrs>(op).eps;
  std::unique_ptr<PreparedOp> out;
  dispatch_t(op, x.dtype, [&](auto t) {
    using T = decltype(t);
    out = make_op([=, x = in_t<T>(b, 0), w = in_t<T>(b, 1), bias = in_t<T>(b, 2), y = out_t<T>(b, 0),
                   mean = out_f(b, 1), rstd = out_f(b, 2)](const StepContext&) {
      layernorm_forward(x, w, bias, y, mean, rstd, N, C, eps);
    });
  });
  return out;
}

std::unique_ptr<PreparedOp> prepare_layernorm_backward(const Program& p, const Op& op, const OpBinding& b) {
  check_arity(op, 5, 3);
  const TensorDesc& x = p.tensor(op.inputs[1]);
  const int64_t C = x.shape.last(), N = x.numel() / C;
  check_numel(p, op, op.inputs[0], N * C, "dy");
  check_numel(p, op, op.inputs[2], C, "w");
  check_numel(p, op, op.inputs[3], N, "mean");
  check_numel(p, op, op.inputs[4], N, "rstd");
  check_numel(p, op, op.outputs[0], N * C, "dx");
  check_numel(p, op, op.outputs[1], C, "dw");
  check_numel(p, op, op.outputs[2], C, "db");
  for (size_t i : {0, 2}) require_dtype(p, op, op.inputs[i], x.dtype);
  for (size_t i : {3, 4}) require_dtype(p, op, op.inputs[i], DType::f32);
  require_dtype(p, op, op.outputs[0], x.dtype);
  const DType g = op.outputs[1] != kNoTensor ? dtype_of(p, op.outputs[1]) : dtype_of(p, op.outputs[2]);
  require_dtype(p, op, op.outputs[1], g);
  require_dtype(p, op, op.outputs[2], g);
  std::unique_ptr<PreparedOp> out;
  dispatch_tg(op, x.dtype, g, [&](auto t, auto gt) {
    using T = decltype(t);
    using G = decltype(gt);
    out = make_op([=, dy = in_t<T>(b, 0), x = in_t<T>(b, 1), w = in_t<T>(b, 2), mean = in_f(b, 3), rstd = in_f(b, 4),
                   dx = out_t<T>(b, 0), dw = out_t<G>(b, 1), db = out_t<G>(b, 2), m0 = op.modes[0], m1 = op.modes[1],
                   m2 = op.modes[2]](const StepContext& ctx) {
      layernorm_backward(dy, x, w, mean, rstd, dx, dw, db, N, C, accumulates(m0, ctx), accumulates(m1, ctx),
                         accumulates(m2, ctx));
    });
  });
  return out;
}

std::unique_ptr<PreparedOp> prepare_matmul(const DnnlEnv& env, const Program& p, const Op& op, const OpBinding& b) {
  const MatmulAttrs a = matmul_attrs(p, op);
  const bool has_bias = op.inputs.size() == 3;
  MatmulKernel kernel(env, a, has_bias, WriteVariants::of(op.modes[0]), matmul_types(p, op));
  kernel.bind(b.inputs[0], b.inputs[1], has_bias ? b.inputs[2] : nullptr, b.outputs[0], scratch_of(p, op, b));
  return make_op([kernel = std::move(kernel), mode = op.modes[0]](const StepContext& ctx) {
    kernel.run(accumulates(mode, ctx));
  });
}

std::unique_ptr<PreparedOp> prepare_bias_grad(const Program& p, const Op& op, const OpBinding& b) {
  check_arity(op, 1, 1);
  const int64_t N = p.tensor(op.outputs[0]).numel(), M = p.tensor(op.inputs[0]).numel() / N;
  check_numel(p, op, op.inputs[0], M * N, "dy");
  std::unique_ptr<PreparedOp> out;
  dispatch_tg(op, dtype_of(p, op.inputs[0]), dtype_of(p, op.outputs[0]), [&](auto t, auto gt) {
    using T = decltype(t);
    using G = decltype(gt);
    out = make_op([=, dy = in_t<T>(b, 0), db = out_t<G>(b, 0), mode = op.modes[0]](const StepContext& ctx) {
      bias_grad(dy, db, M, N, accumulates(mode, ctx));
    });
  });
  return out;
}

std::unique_ptr<PreparedOp> prepare_gelu(const Program& p, const Op& op, const OpBinding& b) {
  const bool fwd = op.kind == OpKind::gelu_forward;
  check_arity(op, fwd ? 1 : 2, 1);
  const int64_t n = p.tensor(op.outputs[0]).numel();
  const DType dt = dtype_of(p, op.outputs[0]);
  for (TensorId id : op.inputs) check_numel(p, op, id, n, "input"), require_dtype(p, op, id, dt);
  std::unique_ptr<PreparedOp> out;
  dispatch_t(op, dt, [&](auto t) {
    using T = decltype(t);
    if (fwd)
      out = make_op([=, x = in_t<T>(b, 0), y = out_t<T>(b, 0), mode = op.modes[0]](const StepContext& ctx) {
        gelu_forward(x, y, n, accumulates(mode, ctx));
      });
    else
      out = make_op([=, dy = in_t<T>(b, 0), x = in_t<T>(b, 1), dx = out_t<T>(b, 0),
                     mode = op.modes[0]](const StepContext& ctx) { gelu_backward(dy, x, dx, n, accumulates(mode, ctx)); });
  });
  return out;
}

std::unique_ptr<PreparedOp> prepare_attention_forward(const DnnlEnv& env, const Program& p, const Op& op,
                                                      const OpBinding& b) {
  check_arity(op, 1, 2);
  const AttentionShape s = attention_shape(p, op);  // y may be absent: a recomputation that needs only probs
  const int64_t B = s.batch, T = s.seq, NH = s.heads, C = s.channels();
  check_numel(p, op, op.inputs[0], B * T * s.qkv_channels(), "qkv");
  check_numel(p, op, op.outputs[0], B * T * C, "y");
  MEMFIT_CHECK(op.outputs[1] != kNoTensor, "kernels", "op '{}': attention needs its probs output", op.name);
  check_numel(p, op, op.outputs[1], B * NH * T * T, "probs");
  require_overwrite(op, 1);
  AttentionForwardKernel kernel(env, s, WriteVariants::of(op.modes[0]));
  kernel.bind(b.inputs[0], b.outputs[0], b.outputs[1], scratch_of(p, op, b));
  return make_op([kernel = std::move(kernel), mode = op.modes[0]](const StepContext& ctx) {
    kernel.run(accumulates(mode, ctx));
  });
}

std::unique_ptr<PreparedOp> prepare_attention_backward(const DnnlEnv& env, const Program& p, const Op& op,
                                                       const OpBinding& b) {
  check_arity(op, 3, 1, 1);
  const AttentionShape s = attention_shape(p, op);
  const int64_t B = s.batch, T = s.seq, NH = s.heads, C = s.channels();
  check_numel(p, op, op.inputs[0], B * T * C, "dy");
  check_numel(p, op, op.inputs[1], B * T * s.qkv_channels(), "qkv");
  check_numel(p, op, op.inputs[2], B * NH * T * T, "probs");
  check_numel(p, op, op.outputs[0], B * T * s.qkv_channels(), "dqkv");
  check_numel(p, op, op.workspace[0], B * NH * T * T, "dprobs");
  AttentionBackwardKernel kernel(env, s, WriteVariants::of(op.modes[0]));
  kernel.bind(b.inputs[0], b.inputs[1], b.inputs[2], b.outputs[0], static_cast<float*>(b.workspace[0]),
              scratch_of(p, op, b));
  return make_op([kernel = std::move(kernel), mode = op.modes[0]](const StepContext& ctx) {
    kernel.run(accumulates(mode, ctx));
  });
}

// Flash attention's tiles live in the library scratch, one slice per OpenMP thread.
uint64_t flash_scratch_bytes(const Op& op) {
  const AttentionShape s = AttentionShape::of(attrs_of<AttentionAttrs>(op));
  const int threads = omp_get_max_threads();
  return op.kind == OpKind::flash_attention_forward ? flash_forward_scratch_bytes(s, threads)
                                                     : flash_backward_scratch_bytes(s, threads);
}

std::unique_ptr<PreparedOp> prepare_flash_attention(const Program& p, const Op& op, const OpBinding& b) {
  const bool fwd = op.kind == OpKind::flash_attention_forward;
  check_arity(op, fwd ? 1 : 4, fwd ? 2 : 1);
  const AttentionShape s = AttentionShape::of(attrs_of<AttentionAttrs>(op));
  const int64_t B = s.batch, T = s.seq, NH = s.heads, C = s.channels();
  const int threads = omp_get_max_threads();
  void* scratch = scratch_of(p, op, b);
  // qkv, y, dy and dqkv share one storage type (any float); lse is fp32.
  const DType ty = dtype_of(p, op.inputs[fwd ? 0 : 1]);
  std::unique_ptr<PreparedOp> out;
  if (fwd) {
    check_numel(p, op, op.inputs[0], B * T * s.qkv_channels(), "qkv");
    MEMFIT_CHECK(op.outputs[0] != kNoTensor && op.outputs[1] != kNoTensor, "kernels",
                 "op '{}': flash attention needs both outputs y and lse", op.name);
    check_numel(p, op, op.outputs[0], B * T * C, "y");
    check_numel(p, op, op.outputs[1], B * NH * T, "lse");
    require_dtype(p, op, op.outputs[0], ty);
    require_dtype(p, op, op.outputs[1], DType::f32);
    require_overwrite(op, 0);
    require_overwrite(op, 1);
    dispatch_t(op, ty, [&](auto t) {
      using E = decltype(t);
      out = make_op([=, qkv = in_t<E>(b, 0), y = out_t<E>(b, 0), lse = out_f(b, 1)](const StepContext&) {
        flash_attention_forward(s, qkv, y, lse, scratch, threads);
      });
    });
    return out;
  }
  check_numel(p, op, op.inputs[0], B * T * C, "dy");
  check_numel(p, op, op.inputs[1], B * T * s.qkv_channels(), "qkv");
  check_numel(p, op, op.inputs[2], B * T * C, "y");
  check_numel(p, op, op.inputs[3], B * NH * T, "lse");
  check_numel(p, op, op.outputs[0], B * T * s.qkv_channels(), "dqkv");
  for (size_t i : {0, 2}) require_dtype(p, op, op.inputs[i], ty);
  require_dtype(p, op, op.inputs[3], DType::f32);
  require_dtype(p, op, op.outputs[0], ty);
  dispatch_t(op, ty, [&](auto t) {
    using E = decltype(t);
    out = make_op([=, dy = in_t<E>(b, 0), qkv = in_t<E>(b, 1), y = in_t<E>(b, 2), lse = in_f(b, 3),
                   dqkv = out_t<E>(b, 0), mode = op.modes[0]](const StepContext& ctx) {
      flash_attention_backward(s, dy, qkv, y, lse, dqkv, accumulates(mode, ctx), scratch, threads);
    });
  });
  return out;
}

std::unique_ptr<PreparedOp> prepare_classifier(const DnnlEnv& env, const Program& p, const Op& op,
                                               const OpBinding& b) {
  const bool train = op.kind == OpKind::classifier;
  check_arity(op, 3, train ? 3 : 1, 1);
  const ClassifierShape s = classifier_shape(p, op);
  const ClassifierOutputs o = classifier_outputs(op);
  if (train) {
    check_numel(p, op, op.outputs[1], s.rows * s.channels, "dx");
    check_numel(p, op, op.outputs[2], s.padded_vocab * s.channels, "dwte");
  }
  require_overwrite(op, 0);
  require_dtype(p, op, op.workspace[0], DType::f32);
  const int64_t chunk_numel = std::min(s.chunk_rows, s.rows) * s.padded_vocab;
  MEMFIT_CHECK(p.tensor(op.workspace[0]).numel() >= chunk_numel, "kernels",
               "op '{}': the logits chunk '{}' has {} elements, fewer than {}", op.name, p.tensor(op.workspace[0]).name,
               p.tensor(op.workspace[0]).numel(), chunk_numel);
  const float grad_scale = attrs_of<ClassifierAttrs>(op).grad_scale;
  ClassifierKernel kernel(env, s, o);
  kernel.bind(b.inputs[0], b.inputs[1], in_i(b, 2), out_f(b, 0), train ? b.outputs[1] : nullptr,
              train ? b.outputs[2] : nullptr, static_cast<float*>(b.workspace[0]), scratch_of(p, op, b));
  const WriteMode m1 = train ? op.modes[1] : WriteMode::overwrite, m2 = train ? op.modes[2] : WriteMode::overwrite;
  return make_op([kernel = std::move(kernel), grad_scale, m1, m2](const StepContext& ctx) {
    kernel.run(grad_scale * ctx.loss_scale, accumulates(m1, ctx), accumulates(m2, ctx));
  });
}

// The update ops' inputs are [grads (n), (norm)]: the norm is there when clipping is on.
size_t update_op_tensors(const Op& op, const AdamWAttrs& a, size_t roles) {
  const size_t n = op.outputs.size() / roles;
  MEMFIT_CHECK(op.outputs.size() % roles == 0, "kernels", "op '{}' ({}) has {} outputs, not {} per tensor", op.name,
               op_kind_name(op.kind), op.outputs.size(), roles);
  check_arity(op, n + (a.max_grad_norm > 0 ? 1 : 0), roles * n);
  return n;
}

const float* clip_norm_input(const Program& p, const Op& op, const AdamWAttrs& a, const OpBinding& b) {
  if (a.max_grad_norm <= 0) return nullptr;
  check_numel(p, op, op.inputs.back(), 1, "norm");
  return in_f(b, op.inputs.size() - 1);
}

// What every gradient is multiplied by: the clipping coefficient over the loss scale.
float update_grad_scale(const float* norm, double max_grad_norm, const StepContext& ctx) {
  const float clip = norm ? clip_coefficient(*norm, max_grad_norm) : 1.0f;
  return ctx.loss_scale == 1.0f ? clip : clip / ctx.loss_scale;
}

std::unique_ptr<PreparedOp> prepare_adamw(const Program& p, const Op& op, const OpBinding& b) {
  const AdamWAttrs& a = attrs_of<AdamWAttrs>(op);
  const size_t n = update_op_tensors(op, a, 3);
  MEMFIT_CHECK(a.weight_decay.empty() || a.weight_decay.size() == n, "kernels",
               "op '{}' (adamw): {} weight decays for {} tensors", op.name, a.weight_decay.size(), n);
  for (TensorId id : op.outputs) {
    MEMFIT_CHECK(id != kNoTensor, "kernels", "op '{}' (adamw): every parameter and state tensor must be present",
                 op.name);
    require_dtype(p, op, id, DType::f32);  // 16-bit parameters are updated through their fp32 masters
  }
  std::vector<AdamWTensor> tensors(n);
  for (size_t i = 0; i < n; ++i) {
    const int64_t numel = p.tensor(op.inputs[i]).numel();
    for (size_t k = 0; k < 3; ++k) check_numel(p, op, op.outputs[i + k * n], numel, "param/m/v");
    tensors[i] = AdamWTensor{out_f(b, i),       b.inputs[i], dtype_of(p, op.inputs[i]), out_f(b, i + n),
                             out_f(b, i + 2 * n), numel,      a.weight_decay.empty() ? 0.0f : a.weight_decay[i]};
  }
  return make_op([set = AdamWSet(std::move(tensors)), b1 = a.beta1, b2 = a.beta2, eps = a.eps,
                  norm = clip_norm_input(p, op, a, b), max_norm = a.max_grad_norm](const StepContext& ctx) {
    set.run(AdamWHyper{ctx.lr, b1, b2, eps, ctx.step, update_grad_scale(norm, max_norm, ctx)});
  });
}

// add: all tensors of one type. accumulate and cast: y (+)= x between any two float types.
std::unique_ptr<PreparedOp> prepare_elementwise(const Program& p, const Op& op, const OpBinding& b) {
  const bool add = op.kind == OpKind::add;
  check_arity(op, add ? 2 : 1, 1);
  const int64_t n = p.tensor(op.outputs[0]).numel();
  for (TensorId id : op.inputs) check_numel(p, op, id, n, "input");
  const DType ty = dtype_of(p, op.outputs[0]);
  std::unique_ptr<PreparedOp> out;
  if (add) {
    for (TensorId id : op.inputs) require_dtype(p, op, id, ty);
    dispatch_t(op, ty, [&](auto t) {
      using T = decltype(t);
      out = make_op([=, a = in_t<T>(b, 0), bb = in_t<T>(b, 1), y = out_t<T>(b, 0),
                     mode = op.modes[0]](const StepContext& ctx) { add_forward(a, bb, y, n, accumulates(mode, ctx)); });
    });
    return out;
  }
  dispatch_t(op, dtype_of(p, op.inputs[0]), [&](auto xt) {
    dispatch_t(op, ty, [&](auto yt) {
      using X = decltype(xt);
      using Y = decltype(yt);
      out = make_op([=, x = in_t<X>(b, 0), y = out_t<Y>(b, 0), mode = op.modes[0]](const StepContext& ctx) {
        accumulate_forward(x, y, n, accumulates(mode, ctx));
      });
    });
  });
  return out;
}

std::unique_ptr<PreparedOp> prepare_check_finite(const Program& p, const Op& op, const OpBinding& b) {
  check_arity(op, op.inputs.size(), 1);
  check_numel(p, op, op.outputs[0], 1, "flag");
  require_dtype(p, op, op.outputs[0], DType::f32);
  require_overwrite(op, 0);
  std::vector<FiniteSpan> spans;
  for (size_t i = 0; i < op.inputs.size(); ++i)
    spans.push_back(FiniteSpan{b.inputs[i], dtype_of(p, op.inputs[i]), p.tensor(op.inputs[i]).numel()});
  return make_op([check = FiniteCheck(std::move(spans)), flag = out_f(b, 0)](const StepContext&) {
    *flag = check.run() ? 1.0f : 0.0f;
  });
}

std::unique_ptr<PreparedOp> prepare_adamw8bit(const Program& p, const Op& op, const OpBinding& b) {
  const AdamWAttrs& a = attrs_of<AdamWAttrs>(op);
  const size_t n = update_op_tensors(op, a, 5);
  MEMFIT_CHECK(a.weight_decay.empty() || a.weight_decay.size() == n, "kernels",
               "op '{}' (adamw8bit): {} weight decays for {} tensors", op.name, a.weight_decay.size(), n);
  MEMFIT_CHECK(a.block >= 1, "kernels", "op '{}' (adamw8bit): block size {}", op.name, a.block);
  for (TensorId id : op.outputs)
    MEMFIT_CHECK(id != kNoTensor, "kernels", "op '{}' (adamw8bit): every parameter and state tensor must be present",
                 op.name);
  std::vector<AdamW8bitTensor> tensors(n);
  for (size_t i = 0; i < n; ++i) {
    const int64_t numel = p.tensor(op.inputs[i]).numel(), blocks = (numel + a.block - 1) / a.block;
    for (size_t k = 0; k < 3; ++k) check_numel(p, op, op.outputs[i + k * n], numel, "param/m codes/v codes");
    for (size_t k = 3; k < 5; ++k) check_numel(p, op, op.outputs[i + k * n], blocks, "absmax");
    tensors[i] = AdamW8bitTensor{out_f(b, i),
                                 b.inputs[i],
                                 static_cast<uint8_t*>(b.outputs[i + n]),
                                 static_cast<uint8_t*>(b.outputs[i + 2 * n]),
                                 out_f(b, i + 3 * n),
                                 out_f(b, i + 4 * n),
                                 numel,
                                 a.weight_decay.empty() ? 0.0f : a.weight_decay[i]};
  }
  AdamW8bitSet set(std::move(tensors), a.block, n ? p.tensor(op.inputs[0]).dtype : DType::f32);
  return make_op([set = std::move(set), b1 = a.beta1, b2 = a.beta2, eps = a.eps, norm = clip_norm_input(p, op, a, b),
                  max_norm = a.max_grad_norm](const StepContext& ctx) {
    set.run(AdamWHyper{ctx.lr, b1, b2, eps, ctx.step, update_grad_scale(norm, max_norm, ctx)});
  });
}

std::unique_ptr<PreparedOp> prepare_grad_norm(const Program& p, const Op& op, const OpBinding& b) {
  const GradNormAttrs::Form form = attrs_of<GradNormAttrs>(op).form;
  check_arity(op, op.inputs.size(), 1, form == GradNormAttrs::Form::sqrt_of_input ? 0 : 1);
  check_numel(p, op, op.outputs[0], 1, "norm");
  require_overwrite(op, 0);
  if (form == GradNormAttrs::Form::sqrt_of_input) {
    check_arity(op, 1, 1);
    check_numel(p, op, op.inputs[0], 1, "sum of squares");
    return make_op([in = static_cast<const float*>(b.inputs[0]), norm = out_f(b, 0)](const StepContext&) {
      *norm = std::sqrt(*in);
    });
  }
  std::vector<GradNormTensor> tensors;
  for (size_t i = 0; i < op.inputs.size(); ++i) tensors.push_back({b.inputs[i], p.tensor(op.inputs[i]).numel()});
  GradNormSet set(std::move(tensors), attrs_of<GradNormAttrs>(op).chunk,
                  op.inputs.empty() ? DType::f32 : p.tensor(op.inputs[0]).dtype);
  MEMFIT_CHECK(p.tensor(op.workspace[0]).numel() >= set.chunks(), "kernels",
               "op '{}' (grad_norm): the partials '{}' hold {} sums, fewer than {} chunks", op.name,
               p.tensor(op.workspace[0]).name, p.tensor(op.workspace[0]).numel(), set.chunks());
  return make_op([set = std::move(set), partials = static_cast<float*>(b.workspace[0]),
                  norm = out_f(b, 0), squares = form == GradNormAttrs::Form::sum_of_squares](const StepContext& ctx) {
    *norm = squares ? set.run_sum_of_squares(partials, 1.0f / ctx.loss_scale) : set.run(partials, 1.0f / ctx.loss_scale);
  });
}

class CpuBackend final : public Backend {
 public:
  CpuBackend() : env_(DnnlEnv::make_cpu()) {}
  std::string_view name() const override { return "cpu"; }

  // 0 for kinds (and dtypes) without a kernel: prepare() is where those fail, with the op named.
  uint64_t scratch_bytes(const Program& program, const Op& op) const override {
    try {
      check_dtypes(program, op);
      switch (op.kind) {
        case OpKind::matmul:
          return MatmulKernel::scratch_bytes(env_, matmul_attrs(program, op), op.inputs.size() == 3,
                                             WriteVariants::of(op.modes.at(0)), matmul_types(program, op));
        case OpKind::attention_forward:
          return AttentionForwardKernel::scratch_bytes(env_, attention_shape(program, op),
                                                       WriteVariants::of(op.modes.at(0)));
        case OpKind::attention_backward:
          return AttentionBackwardKernel::scratch_bytes(env_, attention_shape(program, op),
                                                        WriteVariants::of(op.modes.at(0)));
        case OpKind::flash_attention_forward:
        case OpKind::flash_attention_backward: return flash_scratch_bytes(op);
        case OpKind::classifier:
        case OpKind::classifier_eval:
          check_arity(op, 3, op.kind == OpKind::classifier ? 3 : 1, 1);
          return ClassifierKernel::scratch_bytes(env_, classifier_shape(program, op), classifier_outputs(op));
        default: return 0;
      }
    } catch (const Error&) {
      return 0;
    }
  }

  std::unique_ptr<PreparedOp> prepare(const Program& program, const Op& op, const OpBinding& binding) override {
    MEMFIT_CHECK(op.kind != OpKind::load_input, "kernels",
                 "op '{}' (load_input) is run by the executor, not by a backend", op.name);
    MEMFIT_CHECK(binding.inputs.size() == op.inputs.size() && binding.outputs.size() == op.outputs.size() &&
                     binding.workspace.size() >= op.workspace.size(),
                 "kernels", "op '{}': the binding does not match the op's tensors", op.name);
    check_dtypes(program, op);
    const uint64_t scratch = scratch_bytes(program, op);
    MEMFIT_CHECK(binding.workspace.size() == op.workspace.size(), "kernels",
                 "op '{}': the binding has {} workspace entries for {} workspace tensors", op.name,
                 binding.workspace.size(), op.workspace.size());
    if (scratch > 0) {
      const bool has = !op.workspace.empty() && program.tensor(op.workspace.back()).dtype == DType::u8;
      MEMFIT_CHECK(has && program.tensor(op.workspace.back()).bytes() >= scratch, "kernels",
                   "op '{}' needs {} bytes of library scratch as its last (uint8) workspace tensor", op.name, scratch);
    }
    const bool any_output = std::any_of(op.outputs.begin(), op.outputs.end(), [](TensorId id) { return id != kNoTensor; });
    if (!any_output && op.kind != OpKind::fill) return make_op([](const StepContext&) {});
    switch (op.kind) {
      case OpKind::embedding_forward: return prepare_embedding_forward(program, op, binding);
      case OpKind::embedding_backward: return prepare_embedding_backward(program, op, binding);
      case OpKind::layernorm_forward: return prepare_layernorm_forward(program, op, binding);
      case OpKind::layernorm_backward: return prepare_layernorm_backward(program, op, binding);
      case OpKind::rmsnorm_forward: return prepare_rmsnorm_forward(program, op, binding);
      case OpKind::rmsnorm_backward: return prepare_rmsnorm_backward(program, op, binding);
      case OpKind::swiglu_forward:
      case OpKind::swiglu_backward: return prepare_swiglu(program, op, binding);
      case OpKind::rope_forward:
      case OpKind::rope_backward: return prepare_rope(program, op, binding);
      case OpKind::matmul: return prepare_matmul(env_, program, op, binding);
      case OpKind::bias_grad: return prepare_bias_grad(program, op, binding);
      case OpKind::gelu_forward:
      case OpKind::gelu_backward: return prepare_gelu(program, op, binding);
      case OpKind::attention_forward: return prepare_attention_forward(env_, program, op, binding);
      case OpKind::attention_backward: return prepare_attention_backward(env_, program, op, binding);
      case OpKind::flash_attention_forward:
      case OpKind::flash_attention_backward: return prepare_flash_attention(program, op, binding);
      case OpKind::classifier:
      case OpKind::classifier_eval: return prepare_classifier(env_, program, op, binding);
      case OpKind::adamw: return prepare_adamw(program, op, binding);
      case OpKind::adamw8bit: return prepare_adamw8bit(program, op, binding);
      case OpKind::grad_norm: return prepare_grad_norm(program, op, binding);
      case OpKind::add:
      case OpKind::accumulate:
      case OpKind::cast: return prepare_elementwise(program, op, binding);
      case OpKind::check_finite: return prepare_check_finite(program, op, binding);
      case OpKind::fill: {
        check_arity(op, 0, 1);
        const int64_t n = program.tensor(op.outputs[0]).numel();
        const float value = attrs_of<FillAttrs>(op).value;
        if (program.tensor(op.outputs[0]).dtype != DType::f32 && value == 0.0f && op.modes[0] == WriteMode::overwrite) {
          // Zero is all-zero bits in every float type (ZeRO zeroes the padding of 16-bit buckets).
          return make_op([x = binding.outputs[0], bytes = program.tensor(op.outputs[0]).bytes()](const StepContext&) {
            std::memset(x, 0, bytes);
          });
        }
        require_dtype(program, op, op.outputs[0], DType::f32);
        return make_op([=, x = out_f(binding, 0), mode = op.modes[0]](const StepContext& ctx) {
          fill_forward(x, n, value, accumulates(mode, ctx));
        });
      }
      case OpKind::loss_mean: {
        check_arity(op, 1, 1);
        check_numel(program, op, op.outputs[0], 1, "loss");
        require_dtype(program, op, op.inputs[0], DType::f32);
        require_dtype(program, op, op.outputs[0], DType::f32);
        const int64_t n = program.tensor(op.inputs[0]).numel();
        const float scale = attrs_of<ScaleAttrs>(op).scale;
        return make_op([=, l = in_f(binding, 0), y = out_f(binding, 0), mode = op.modes[0]](const StepContext& ctx) {
          loss_mean(l, y, n, scale, accumulates(mode, ctx));
        });
      }
      default: break;
    }
    const TensorId first = !op.outputs.empty() && op.outputs[0] != kNoTensor ? op.outputs[0]
                           : !op.inputs.empty()                              ? op.inputs[0]
                                                                             : kNoTensor;
    no_kernel(op, first != kNoTensor ? program.tensor(first).dtype : DType::f32);
  }

 private:
  DnnlEnv env_;
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend() { return std::make_unique<CpuBackend>(); }

}  // namespace memfit
