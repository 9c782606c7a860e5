// The CPU backend: turns each op of a program into a PreparedOp bound to fixed addresses.
// prepare() reads shapes from the program and attributes from the op, validates them, builds
// the oneDNN primitives and captures everything a run needs in a closure, so that run() is
// a direct call into a kernel: no lookups, no allocation in memfit code.
//
// Subtle point: write modes are resolved at run time (accumulate_after_first_micro flips
// between micro-steps), so a kernel whose products are oneDNN primitives gets every variant
// its mode can take at prepare time, and scratch_bytes() builds exactly the same set of
// primitive descriptors to size the scratch the plan reserves.
#include <omp.h>

#include <algorithm>
#include <memory>
#include <utility>

#include "core/error.hpp"
#include "kernels/backend.hpp"
#include "kernels/cpu/adamw.hpp"
#include "kernels/cpu/attention.hpp"
#include "kernels/cpu/classifier.hpp"
#include "kernels/cpu/dnnl_matmul.hpp"
#include "kernels/cpu/elementwise.hpp"
#include "kernels/cpu/embedding.hpp"
#include "kernels/cpu/flash_attention.hpp"
#include "kernels/cpu/gelu.hpp"
#include "kernels/cpu/layernorm.hpp"
#include "kernels/cpu/matmul.hpp"
#include "kernels/cpu/reduce.hpp"

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

// Checks the op's tensors are fp32, except the integer token/target inputs of the kinds
// that have them.
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
    const DType want = int_input(i) ? DType::i32 : DType::f32;
    if (program.tensor(op.inputs[i]).dtype != want) no_kernel(op, program.tensor(op.inputs[i]).dtype);
  }
  for (TensorId id : op.outputs)
    if (id != kNoTensor && program.tensor(id).dtype != DType::f32) no_kernel(op, program.tensor(id).dtype);
  // uint8 workspace is library scratch (runtime/compile.cpp), bytes without a type.
  for (TensorId id : op.workspace)
    if (program.tensor(id).dtype != DType::f32 && program.tensor(id).dtype != DType::u8)
      no_kernel(op, program.tensor(id).dtype);
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

ClassifierShape classifier_shape(const Program& program, const Op& op) {
  const ClassifierAttrs& a = attrs_of<ClassifierAttrs>(op);
  const TensorDesc& wte = program.tensor(op.inputs[1]);
  ClassifierShape s;
  s.rows = a.rows;
  s.channels = wte.shape.last();
  s.vocab = a.vocab;
  s.padded_vocab = wte.shape.rows();
  s.chunk_rows = a.chunk_rows;
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
  check_arity(op, 3, 1);
  const TensorDesc& tokens = p.tensor(op.inputs[0]);
  const TensorDesc& wte = p.tensor(op.inputs[1]);
  const int64_t N = tokens.numel(), seq = tokens.shape.last(), C = wte.shape.last(), Vp = wte.shape.rows();
  MEMFIT_CHECK(p.tensor(op.inputs[2]).shape.rows() >= seq, "kernels", "op '{}': wpe has fewer rows than T={}",
               op.name, seq);
  check_numel(p, op, op.outputs[0], N * C, "x");
  return make_op([=, tok = in_i(b, 0), wte = in_f(b, 1), wpe = in_f(b, 2), x = out_f(b, 0),
                  mode = op.modes[0]](const StepContext& ctx) {
    embedding_forward(tok, wte, wpe, x, N, seq, C, Vp, accumulates(mode, ctx));
  });
}

std::unique_ptr<PreparedOp> prepare_embedding_backward(const Program& p, const Op& op, const OpBinding& b) {
  check_arity(op, 2, 2);
  const TensorDesc& tokens = p.tensor(op.inputs[1]);
  const int64_t N = tokens.numel(), seq = tokens.shape.last();
  const int64_t C = p.tensor(op.inputs[0]).shape.last();
  check_numel(p, op, op.inputs[0], N * C, "dx");
  const int64_t Vp = op.outputs[0] != kNoTensor ? p.tensor(op.outputs[0]).shape.rows() : 0;
  const int64_t Tmax = op.outputs[1] != kNoTensor ? p.tensor(op.outputs[1]).shape.rows() : 0;
  MEMFIT_CHECK(op.outputs[1] == kNoTensor || Tmax >= seq, "kernels", "op '{}': dwpe has fewer rows than T={}",
               op.name, seq);
  return make_op([=, dx = in_f(b, 0), tok = in_i(b, 1), dwte = out_f(b, 0), dwpe = out_f(b, 1), m0 = op.modes[0],
                  m1 = op.modes[1]](const StepContext& ctx) {
    embedding_backward(dx, tok, dwte, dwpe, N, seq, C, Vp, Tmax, accumulates(m0, ctx), accumulates(m1, ctx));
  });
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
  const float eps = attrs_of<NormAttrs>(op).eps;
  return make_op([=, x = in_f(b, 0), w = in_f(b, 1), bias = in_f(b, 2), y = out_f(b, 0), mean = out_f(b, 1),
                  rstd = out_f(b, 2)](const StepContext&) { layernorm_forward(x, w, bias, y, mean, rstd, N, C, eps); });
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
  return make_op([=, dy = in_f(b, 0), x = in_f(b, 1), w = in_f(b, 2), mean = in_f(b, 3), rstd = in_f(b, 4),
                  dx = out_f(b, 0), dw = out_f(b, 1), db = out_f(b, 2), m0 = op.modes[0], m1 = op.modes[1],
                  m2 = op.modes[2]](const StepContext& ctx) {
    layernorm_backward(dy, x, w, mean, rstd, dx, dw, db, N, C, accumulates(m0, ctx), accumulates(m1, ctx),
                       accumulates(m2, ctx));
  });
}

std::unique_ptr<PreparedOp> prepare_matmul(const DnnlEnv& env, const Program& p, const Op& op, const OpBinding& b) {
  const MatmulAttrs a = matmul_attrs(p, op);
  const bool has_bias = op.inputs.size() == 3;
  MatmulKernel kernel(env, a, has_bias, WriteVariants::of(op.modes[0]));
  kernel.bind(in_f(b, 0), in_f(b, 1), has_bias ? in_f(b, 2) : nullptr, out_f(b, 0), scratch_of(p, op, b));
  return make_op([kernel = std::move(kernel), mode = op.modes[0]](const StepContext& ctx) {
    kernel.run(accumulates(mode, ctx));
  });
}

std::unique_ptr<PreparedOp> prepare_bias_grad(const Program& p, const Op& op, const OpBinding& b) {
  check_arity(op, 1, 1);
  const int64_t N = p.tensor(op.outputs[0]).numel(), M = p.tensor(op.inputs[0]).numel() / N;
  check_numel(p, op, op.inputs[0], M * N, "dy");
  return make_op([=, dy = in_f(b, 0), db = out_f(b, 0), mode = op.modes[0]](const StepContext& ctx) {
    bias_grad(dy, db, M, N, accumulates(mode, ctx));
  });
}

std::unique_ptr<PreparedOp> prepare_gelu(const Program& p, const Op& op, const OpBinding& b) {
  const bool fwd = op.kind == OpKind::gelu_forward;
  check_arity(op, fwd ? 1 : 2, 1);
  const int64_t n = p.tensor(op.outputs[0]).numel();
  for (TensorId id : op.inputs) check_numel(p, op, id, n, "input");
  if (fwd)
    return make_op([=, x = in_f(b, 0), y = out_f(b, 0), mode = op.modes[0]](const StepContext& ctx) {
      gelu_forward(x, y, n, accumulates(mode, ctx));
    });
  return make_op([=, dy = in_f(b, 0), x = in_f(b, 1), dx = out_f(b, 0), mode = op.modes[0]](const StepContext& ctx) {
    gelu_backward(dy, x, dx, n, accumulates(mode, ctx));
  });
}

std::unique_ptr<PreparedOp> prepare_attention_forward(const DnnlEnv& env, const Program& p, const Op& op,
                                                      const OpBinding& b) {
  check_arity(op, 1, 2);
  const AttentionShape s = AttentionShape::of(attrs_of<AttentionAttrs>(op));
  const int64_t B = s.batch, T = s.seq, NH = s.heads, C = s.channels();
  check_numel(p, op, op.inputs[0], B * T * 3 * C, "qkv");
  check_numel(p, op, op.outputs[0], B * T * C, "y");
  MEMFIT_CHECK(op.outputs[1] != kNoTensor, "kernels", "op '{}': attention needs its probs output", op.name);
  check_numel(p, op, op.outputs[1], B * NH * T * T, "probs");
  require_overwrite(op, 1);
  AttentionForwardKernel kernel(env, s, WriteVariants::of(op.modes[0]));
  kernel.bind(in_f(b, 0), out_f(b, 0), out_f(b, 1), scratch_of(p, op, b));
  return make_op([kernel = std::move(kernel), mode = op.modes[0]](const StepContext& ctx) {
    kernel.run(accumulates(mode, ctx));
  });
}

std::unique_ptr<PreparedOp> prepare_attention_backward(const DnnlEnv& env, const Program& p, const Op& op,
                                                       const OpBinding& b) {
  check_arity(op, 3, 1, 1);
  const AttentionShape s = AttentionShape::of(attrs_of<AttentionAttrs>(op));
  const int64_t B = s.batch, T = s.seq, NH = s.heads, C = s.channels();
  check_numel(p, op, op.inputs[0], B * T * C, "dy");
  check_numel(p, op, op.inputs[1], B * T * 3 * C, "qkv");
  check_numel(p, op, op.inputs[2], B * NH * T * T, "probs");
  check_numel(p, op, op.outputs[0], B * T * 3 * C, "dqkv");
  check_numel(p, op, op.workspace[0], B * NH * T * T, "dprobs");
  AttentionBackwardKernel kernel(env, s, WriteVariants::of(op.modes[0]));
  kernel.bind(in_f(b, 0), in_f(b, 1), in_f(b, 2), out_f(b, 0), static_cast<float*>(b.workspace[0]),
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
  if (fwd) {
    check_numel(p, op, op.inputs[0], B * T * 3 * C, "qkv");
    MEMFIT_CHECK(op.outputs[0] != kNoTensor && op.outputs[1] != kNoTensor, "kernels",
                 "op '{}': flash attention needs both outputs y and lse", op.name);
    check_numel(p, op, op.outputs[0], B * T * C, "y");
    check_numel(p, op, op.outputs[1], B * NH * T, "lse");
    require_overwrite(op, 0);
    require_overwrite(op, 1);
    return make_op([=, qkv = in_f(b, 0), y = out_f(b, 0), lse = out_f(b, 1)](const StepContext&) {
      flash_attention_forward(s, qkv, y, lse, scratch, threads);
    });
  }
  check_numel(p, op, op.inputs[0], B * T * C, "dy");
  check_numel(p, op, op.inputs[1], B * T * 3 * C, "qkv");
  check_numel(p, op, op.inputs[2], B * T * C, "y");
  check_numel(p, op, op.inputs[3], B * NH * T, "lse");
  check_numel(p, op, op.outputs[0], B * T * 3 * C, "dqkv");
  return make_op([=, dy = in_f(b, 0), qkv = in_f(b, 1), y = in_f(b, 2), lse = in_f(b, 3), dqkv = out_f(b, 0),
                  mode = op.modes[0]](const StepContext& ctx) {
    flash_attention_backward(s, dy, qkv, y, lse, dqkv, accumulates(mode, ctx), scratch, threads);
  });
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
  const int64_t chunk_numel = std::min(s.chunk_rows, s.rows) * s.padded_vocab;
  MEMFIT_CHECK(p.tensor(op.workspace[0]).numel() >= chunk_numel, "kernels",
               "op '{}': the logits chunk '{}' has {} elements, fewer than {}", op.name, p.tensor(op.workspace[0]).name,
               p.tensor(op.workspace[0]).numel(), chunk_numel);
  const float grad_scale = attrs_of<ClassifierAttrs>(op).grad_scale;
  ClassifierKernel kernel(env, s, o);
  kernel.bind(in_f(b, 0), in_f(b, 1), in_i(b, 2), out_f(b, 0), train ? out_f(b, 1) : nullptr,
              train ? out_f(b, 2) : nullptr, static_cast<float*>(b.workspace[0]), scratch_of(p, op, b));
  const WriteMode m1 = train ? op.modes[1] : WriteMode::overwrite, m2 = train ? op.modes[2] : WriteMode::overwrite;
  return make_op([kernel = std::move(kernel), grad_scale, m1, m2](const StepContext& ctx) {
    kernel.run(grad_scale * ctx.loss_scale, accumulates(m1, ctx), accumulates(m2, ctx));
  });
}

std::unique_ptr<PreparedOp> prepare_adamw(const Program& p, const Op& op, const OpBinding& b) {
  const size_t n = op.inputs.size();
  check_arity(op, n, 3 * n);
  const AdamWAttrs& a = attrs_of<AdamWAttrs>(op);
  MEMFIT_CHECK(a.weight_decay.empty() || a.weight_decay.size() == n, "kernels",
               "op '{}' (adamw): {} weight decays for {} tensors", op.name, a.weight_decay.size(), n);
  for (TensorId id : op.outputs)
    MEMFIT_CHECK(id != kNoTensor, "kernels", "op '{}' (adamw): every parameter and state tensor must be present",
                 op.name);
  std::vector<AdamWTensor> tensors(n);
  for (size_t i = 0; i < n; ++i) {
    const int64_t numel = p.tensor(op.inputs[i]).numel();
    for (size_t k = 0; k < 3; ++k) check_numel(p, op, op.outputs[i + k * n], numel, "param/m/v");
    tensors[i] = AdamWTensor{out_f(b, i), in_f(b, i), out_f(b, i + n), out_f(b, i + 2 * n), numel,
                             a.weight_decay.empty() ? 0.0f : a.weight_decay[i]};
  }
  return make_op([set = AdamWSet(std::move(tensors)), b1 = a.beta1, b2 = a.beta2, eps = a.eps](const StepContext& ctx) {
    set.run(AdamWHyper{ctx.lr, b1, b2, eps, ctx.step});
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
    } catch (const Error&) {
      return 0;
    }
    switch (op.kind) {
      case OpKind::matmul:
        return MatmulKernel::scratch_bytes(env_, matmul_attrs(program, op), op.inputs.size() == 3,
                                           WriteVariants::of(op.modes.at(0)));
      case OpKind::attention_forward:
        return AttentionForwardKernel::scratch_bytes(env_, AttentionShape::of(attrs_of<AttentionAttrs>(op)),
                                                     WriteVariants::of(op.modes.at(0)));
      case OpKind::attention_backward:
        return AttentionBackwardKernel::scratch_bytes(env_, AttentionShape::of(attrs_of<AttentionAttrs>(op)),
                                                      WriteVariants::of(op.modes.at(0)));
      case OpKind::flash_attention_forward:
      case OpKind::flash_attention_backward: return flash_scratch_bytes(op);
      case OpKind::classifier:
      case OpKind::classifier_eval:
        check_arity(op, 3, op.kind == OpKind::classifier ? 3 : 1, 1);
        return ClassifierKernel::scratch_bytes(env_, classifier_shape(program, op), classifier_outputs(op));
      default: return 0;
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
      case OpKind::add: {
        check_arity(op, 2, 1);
        const int64_t n = program.tensor(op.outputs[0]).numel();
        for (TensorId id : op.inputs) check_numel(program, op, id, n, "input");
        return make_op([=, a = in_f(binding, 0), bb = in_f(binding, 1), y = out_f(binding, 0),
                        mode = op.modes[0]](const StepContext& ctx) { add_forward(a, bb, y, n, accumulates(mode, ctx)); });
      }
      case OpKind::accumulate: {
        check_arity(op, 1, 1);
        const int64_t n = program.tensor(op.outputs[0]).numel();
        check_numel(program, op, op.inputs[0], n, "x");
        return make_op([=, x = in_f(binding, 0), y = out_f(binding, 0), mode = op.modes[0]](const StepContext& ctx) {
          accumulate_forward(x, y, n, accumulates(mode, ctx));
        });
      }
      case OpKind::fill: {
        check_arity(op, 0, 1);
        const int64_t n = program.tensor(op.outputs[0]).numel();
        const float value = attrs_of<FillAttrs>(op).value;
        return make_op([=, x = out_f(binding, 0), mode = op.modes[0]](const StepContext& ctx) {
          fill_forward(x, n, value, accumulates(mode, ctx));
        });
      }
      case OpKind::loss_mean: {
        check_arity(op, 1, 1);
        check_numel(program, op, op.outputs[0], 1, "loss");
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
