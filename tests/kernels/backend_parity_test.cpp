// Every backend against every other, in the manner of ggml's test-backend-ops: for each op
// kind and dtype that both the CPU and the reference backend declare in their capabilities
// (graph/capabilities.hpp), one op is built with random inputs, run on each backend from the
// same bytes, and every output compared. The reference backend's naive kernels accumulate in
// double, so this also bounds the CPU kernels' error on each kind. A (kind, dtype) both
// backends support without a case here fails the test: a new kernel gets a parity case.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "kernel_test_util.hpp"
#include "kernels/backend.hpp"
#include "program_fixture.hpp"

namespace memfit {
namespace {

using test::ProgramFixture;

// Normalised max error allowed between the fp32 CPU kernels and the double-accumulating
// reference on these small shapes (measured: at most a few 1e-7; see the report).
constexpr double kParityTol = 1e-5;
// 8-bit AdamW: the requantised codes may land on the neighbouring code when the two fp32
// moments straddle a midpoint; at most this share of codes may differ (by one step).
constexpr double kCodeMismatchShare = 0.02;

// Builds one op of a kind on a fixture, its inputs (and the previous values of its outputs)
// filled from seeds, so that two fixtures built the same way hold the same bytes.
class CaseBuilder {
 public:
  explicit CaseBuilder(ProgramFixture& f) : f_(f) {}

  TensorId floats(const std::string& name, Shape shape, double lo = -1, double hi = 1) {
    const TensorId id = f_.tensor(name, std::move(shape));
    f_.set(id, test::random_vector(size_t(f_.program.tensor(id).numel()), next_seed(), lo, hi));
    return id;
  }
  TensorId ints(const std::string& name, Shape shape, int32_t bound) {
    const TensorId id = f_.tensor(name, std::move(shape), DType::i32);
    f_.set(id, test::random_ints(size_t(f_.program.tensor(id).numel()), bound, next_seed()));
    return id;
  }
  TensorId codes(const std::string& name, Shape shape) {
    const TensorId id = f_.tensor(name, std::move(shape), DType::u8);
    const std::vector<int32_t> v = test::random_ints(size_t(f_.program.tensor(id).numel()), 256, next_seed());
    for (size_t i = 0; i < v.size(); ++i) f_.data<uint8_t>(id)[i] = uint8_t(v[i]);
    return id;
  }

 private:
  uint32_t next_seed() { return 1000 + seed_++; }
  ProgramFixture& f_;
  uint32_t seed_ = 0;
};

constexpr int64_t B = 2, T = 5, NH = 2, HS = 4, C = NH * HS, N = B * T, V = 11, Vp = 16;

AttentionAttrs attention_attrs(int64_t kv_heads) {
  AttentionAttrs a;
  a.batch = B, a.seq = T, a.heads = NH, a.kv_heads = kv_heads, a.head_dim = HS;
  a.scale = 1.0f / std::sqrt(float(HS));
  a.rope_theta = 10000.0f;
  return a;
}

// One case per kind; returns the op's index in the fixture.
int build_case(OpKind kind, ProgramFixture& f) {
  CaseBuilder t(f);
  const WriteMode ow = WriteMode::overwrite, acc = WriteMode::accumulate, upd = WriteMode::update;
  switch (kind) {
    case OpKind::embedding_forward:
      return f.op(kind, {t.ints("tok", {B, T}, int32_t(V)), t.floats("wte", {Vp, C}), t.floats("wpe", {T, C})},
                  {t.floats("x", {B, T, C})});
    case OpKind::embedding_backward:
      return f.op(kind, {t.floats("dx", {B, T, C}), t.ints("tok", {B, T}, int32_t(V))},
                  {t.floats("dwte", {Vp, C}), t.floats("dwpe", {T, C})}, NoAttrs{}, {acc, ow});
    case OpKind::layernorm_forward:
      return f.op(kind, {t.floats("x", {N, C}, -2, 2), t.floats("w", {C}), t.floats("b", {C})},
                  {t.floats("y", {N, C}), t.floats("mean", {N}), t.floats("rstd", {N})}, NormAttrs{});
    case OpKind::layernorm_backward:
      return f.op(kind,
                  {t.floats("dy", {N, C}), t.floats("x", {N, C}), t.floats("w", {C}), t.floats("mean", {N}),
                   t.floats("rstd", {N}, 0.5, 1.5)},
                  {t.floats("dx", {N, C}), t.floats("dw", {C}), t.floats("db", {C})}, NormAttrs{}, {ow, acc, acc});
    case OpKind::rmsnorm_forward:
      return f.op(kind, {t.floats("x", {N, C}, -2, 2), t.floats("w", {C})}, {t.floats("y", {N, C}), t.floats("rstd", {N})},
                  NormAttrs{});
    case OpKind::rmsnorm_backward:
      return f.op(kind, {t.floats("dy", {N, C}), t.floats("x", {N, C}), t.floats("w", {C}), t.floats("rstd", {N}, 0.5, 1.5)},
                  {t.floats("dx", {N, C}), t.floats("dw", {C})}, NormAttrs{}, {acc, ow});
    case OpKind::matmul: {
      MatmulAttrs a;
      a.m = N, a.n = 3 * C, a.k = C, a.trans_b = true, a.alpha = 0.5f;
      return f.op(kind, {t.floats("a", {N, C}), t.floats("b", {3 * C, C}), t.floats("bias", {3 * C})},
                  {t.floats("c", {N, 3 * C})}, a, {acc});
    }
    case OpKind::bias_grad: return f.op(kind, {t.floats("dy", {N, C})}, {t.floats("db", {C})}, NoAttrs{}, {acc});
    case OpKind::gelu_forward: return f.op(kind, {t.floats("x", {N, C}, -3, 3)}, {t.floats("y", {N, C})});
    case OpKind::gelu_backward:
      return f.op(kind, {t.floats("dy", {N, C}), t.floats("x", {N, C}, -3, 3)}, {t.floats("dx", {N, C})}, NoAttrs{}, {acc});
    case OpKind::swiglu_forward:
      return f.op(kind, {t.floats("g", {N, C}, -3, 3), t.floats("u", {N, C})}, {t.floats("y", {N, C})});
    case OpKind::swiglu_backward:
      return f.op(kind, {t.floats("dy", {N, C}), t.floats("g", {N, C}, -3, 3), t.floats("u", {N, C})},
                  {t.floats("dg", {N, C}), t.floats("du", {N, C})}, NoAttrs{}, {ow, acc});
    case OpKind::rope_forward:
    case OpKind::rope_backward:  // grouped: 2 query heads, 1 kv head
      return f.op(kind, {t.floats("qkv", {B, T, (NH + 2) * HS})}, {t.floats("y", {B, T, (NH + 2) * HS})},
                  attention_attrs(1));
    case OpKind::attention_forward:
      return f.op(kind, {t.floats("qkv", {B, T, 3 * C}, -2, 2)}, {t.floats("y", {B, T, C}), t.floats("probs", {B, NH, T, T})},
                  attention_attrs(NH));
    case OpKind::attention_backward: {
      // Probabilities as the forward leaves them: causal rows summing to one, zero above the diagonal.
      const TensorId probs = t.floats("probs", {B, NH, T, T}, 0.1, 1);
      float* pr = f.data(probs);
      for (int64_t row = 0; row < B * NH * T; ++row) {
        const int64_t pos = row % T;
        double sum = 0;
        for (int64_t s = 0; s < T; ++s) sum += s <= pos ? pr[row * T + s] : 0.0;
        for (int64_t s = 0; s < T; ++s) pr[row * T + s] = s <= pos ? float(pr[row * T + s] / sum) : 0.0f;
      }
      return f.op(kind, {t.floats("dy", {B, T, C}), t.floats("qkv", {B, T, 3 * C}, -2, 2), probs},
                  {t.floats("dqkv", {B, T, 3 * C})}, attention_attrs(NH), {acc}, {t.floats("dprobs", {B, NH, T, T})});
    }
    case OpKind::flash_attention_forward:
      return f.op(kind, {t.floats("qkv", {B, T, (NH + 2) * HS}, -2, 2)},
                  {t.floats("y", {B, T, C}), t.floats("lse", {B, NH, T})}, attention_attrs(1));
    case OpKind::flash_attention_backward:
      return f.op(kind,
                  {t.floats("dy", {B, T, C}), t.floats("qkv", {B, T, (NH + 2) * HS}, -2, 2), t.floats("y", {B, T, C}),
                   t.floats("lse", {B, NH, T}, 1, 2)},
                  {t.floats("dqkv", {B, T, (NH + 2) * HS})}, attention_attrs(1), {acc});
    case OpKind::classifier:
    case OpKind::classifier_eval: {
      ClassifierAttrs a;
      a.rows = N, a.vocab = V, a.chunk_rows = 4, a.grad_scale = 1.0f / float(N);
      const std::vector<TensorId> in = {t.floats("x", {N, C}, -2, 2), t.floats("wte", {Vp, C}, -2, 2),
                                        t.ints("targets", {N}, int32_t(V))};
      const TensorId chunk = t.floats("logits", {4, Vp});
      if (kind == OpKind::classifier_eval) return f.op(kind, in, {t.floats("losses", {N})}, a, {}, {chunk});
      return f.op(kind, in, {t.floats("losses", {N}), t.floats("dx", {N, C}), t.floats("dwte", {Vp, C})}, a,
                  {ow, ow, acc}, {chunk});
    }
    case OpKind::classifier_partial:
    case OpKind::classifier_parallel_backward: {
      // The second of two slices of 8 columns: global columns 8..15, of which 8..10 are real.
      ClassifierAttrs a;
      a.rows = N, a.vocab = V, a.chunk_rows = 4, a.grad_scale = 1.0f / float(N), a.vocab_begin = 8;
      std::vector<TensorId> in = {t.floats("x", {N, C}), t.floats("w", {8, C}), t.ints("targets", {N}, int32_t(V))};
      const TensorId chunk = t.floats("logits", {4, 8});
      if (kind == OpKind::classifier_partial) return f.op(kind, in, {t.floats("stats", {N, 3})}, a, {ow}, {chunk});
      in.push_back(t.floats("lse", {N}, 2, 4));
      return f.op(kind, in, {t.floats("dx", {N, C}), t.floats("dw", {8, C})}, a, {acc, ow}, {chunk});
    }
    case OpKind::classifier_combine: {
      ClassifierAttrs a;
      a.rows = N, a.parts = 2;
      const TensorId stats = t.floats("stats", {2, N, 3}, 0.5, 3);  // m, s > 0 and t of two slices
      return f.op(kind, {stats}, {t.floats("losses", {N}), t.floats("lse", {N})}, a, {ow, ow});
    }
    case OpKind::add_bias:
      return f.op(kind, {t.floats("x", {N, C}), t.floats("b", {C})}, {t.floats("y", {N, C})}, NoAttrs{}, {acc});
    case OpKind::loss_mean:
      return f.op(kind, {t.floats("losses", {N}, 0, 3)}, {t.floats("loss", {1})}, ScaleAttrs{0.25f}, {acc});
    case OpKind::add:
      return f.op(kind, {t.floats("a", {N, C}), t.floats("b", {N, C})}, {t.floats("y", {N, C})}, NoAttrs{}, {acc});
    case OpKind::accumulate:
    case OpKind::cast: return f.op(kind, {t.floats("x", {N, C})}, {t.floats("y", {N, C})}, NoAttrs{}, {acc});
    case OpKind::add_columns:
      return f.op(kind, {t.floats("a", {N, 3 * C}), t.floats("d", {N, C})}, {t.floats("y", {N, 3 * C})},
                  ColumnsAttrs{N, 3 * C, C, C}, {acc});
    case OpKind::slice_columns:
      return f.op(kind, {t.floats("x", {N, 3 * C})}, {t.floats("y", {N, C})}, ColumnsAttrs{N, 3 * C, 2 * C, C}, {acc});
    case OpKind::dropout_forward:
    case OpKind::dropout_backward:
      return f.op(kind, {t.floats("x", {N, C})}, {t.floats("y", {N, C})}, DropoutAttrs{0.3f, 77}, {ow});
    case OpKind::quant_linear:
    case OpKind::quant_linear_backward: {
      // Two NF4 pieces (16 and 8 rows of 8: blocks of 32 never straddle them), tiles of 5 rows
      // (the last of each piece partial); any code byte is a valid pair of codes.
      QuantLinearAttrs a;
      a.m = N, a.n = 3 * C, a.k = C, a.spec.block = 32, a.tile_rows = 5, a.segments = {2 * C, C};
      const bool forward = kind == OpKind::quant_linear;
      a.has_bias = forward;
      std::vector<TensorId> in{forward ? t.floats("x", {N, C}) : t.floats("dy", {N, 3 * C}), t.codes("codes", {3 * C * C / 2}),
                               t.floats("absmax", {3 * C * C / 32}, 0.1, 2)};
      if (forward) in.push_back(t.floats("bias", {3 * C}));
      const TensorId out = forward ? t.floats("y", {N, 3 * C}) : t.floats("dx", {N, C});
      return f.op(kind, in, {out}, a, {forward ? ow : acc}, {t.floats("tile", {5, C})});
    }
    case OpKind::dora_norm:  // the middle piece of three, rank 2
      return f.op(kind, {t.floats("w", {3 * C, C}), t.floats("a", {2, C}), t.floats("b", {C, 2})},
                  {t.floats("norm", {C})}, DoraNormAttrs{C, C, C, 2, 1.5f});
    case OpKind::dora_scale:
    case OpKind::dora_scale_backward: {  // blocks [0, C) and [2C, 3C) of 3C columns, with a bias
      const bool forward = kind == OpKind::dora_scale;
      std::vector<TensorId> in;
      if (!forward) in.push_back(t.floats("dy", {N, 3 * C}));
      in.push_back(t.floats("z", {N, 3 * C}));
      for (const char* block : {"0", "1"})
        in.insert(in.end(), {t.floats(std::string("m") + block, {C}, 0.5, 2),
                             t.floats(std::string("norm") + block, {C}, 0.5, 2)});
      in.push_back(t.floats("bias", {3 * C}));
      const DoraScaleAttrs a{N, 3 * C, {0, 2 * C}, {C, C}, true};
      if (forward) return f.op(kind, in, {t.floats("y", {N, 3 * C})}, a, {acc});
      return f.op(kind, in,  // with a trained bias's gradient (0 outside the blocks)
                  {t.floats("dz", {N, 3 * C}), t.floats("dm0", {C}), t.floats("dm1", {C}), t.floats("db", {3 * C})}, a,
                  {acc, acc, ow, ow});
    }
    case OpKind::dora_blend:
    case OpKind::dora_blend_backward: {  // blocks [0, C) and [2C, 3C) of 3C columns
      const bool forward = kind == OpKind::dora_blend;
      std::vector<TensorId> in{forward ? t.floats("y0", {N, 3 * C}) : t.floats("dy", {N, 3 * C})};
      for (const char* block : {"0", "1"}) {
        const std::string i = block;
        in.insert(in.end(), {t.floats("m" + i, {C}, 0.5, 2), t.floats("norm" + i, {C}, 0.5, 2)});
        if (forward) in.insert(in.end(), {t.floats("p" + i, {N, C}), t.floats("q" + i, {N, C})});
        else in.push_back(t.floats("z" + i, {N, C}));
      }
      const DoraScaleAttrs a{N, 3 * C, {0, 2 * C}, {C, C}, false};
      if (forward)
        return f.op(kind, in, {t.floats("y", {N, 3 * C}), t.floats("z0", {N, C}), t.floats("z1", {N, C})}, a,
                    {acc, ow, ow});
      return f.op(kind, in,
                  {t.floats("dp0", {N, C}), t.floats("dq0", {N, C}), t.floats("dm0", {C}), t.floats("dp1", {N, C}),
                   t.floats("dq1", {N, C}), t.floats("dm1", {C})},
                  a, {acc, ow, acc, ow, acc, ow});
    }
    case OpKind::fill: return f.op(kind, {}, {t.floats("x", {N, C})}, FillAttrs{0.75f}, {acc});
    case OpKind::grad_norm: {
      GradNormAttrs a;
      a.chunk = 16;
      return f.op(kind, {t.floats("g1", {37}), t.floats("g2", {50})}, {t.floats("norm", {1})}, a, {},
                  {t.floats("partials", {6})});
    }
    case OpKind::adamw: {
      AdamWAttrs a;
      a.weight_decay = {0.1f, 0.0f};
      a.max_grad_norm = 0.5;
      return f.op(kind, {t.floats("g1", {37}), t.floats("g2", {50}), t.floats("norm", {1}, 0.2, 2)},
                  {t.floats("p1", {37}), t.floats("p2", {50}), t.floats("m1", {37}), t.floats("m2", {50}),
                   t.floats("v1", {37}, 0, 1), t.floats("v2", {50}, 0, 1)},
                  a, {upd, upd, upd, upd, upd, upd});
    }
    case OpKind::adamw8bit: {
      AdamWAttrs a;
      a.weight_decay = {0.1f};
      a.block = 16;
      return f.op(kind, {t.floats("g", {40})},
                  {t.floats("p", {40}), t.codes("mc", {40}), t.codes("vc", {40}), t.floats("ma", {3}, 0.1, 1),
                   t.floats("va", {3}, 0.1, 1)},
                  a, {upd, upd, upd, upd, upd});
    }
    default: return -1;
  }
}

struct Outputs {
  std::vector<std::vector<float>> floats;
  std::vector<std::vector<uint8_t>> codes;
};

Outputs run_case(Backend& backend, OpKind kind) {
  ProgramFixture f;
  const int op = build_case(kind, f);
  StepContext ctx;
  ctx.step = 3, ctx.lr = 1e-2;
  f.prepare(backend, op)->run(ctx);
  Outputs out;
  for (TensorId id : f.program.op(op).outputs) {
    if (f.program.tensor(id).dtype == DType::u8) out.codes.push_back(f.get<uint8_t>(id));
    else out.floats.push_back(f.get(id));
  }
  return out;
}

TEST(BackendParity, EveryKindBothBackendsSupportGivesTheSameOutputs) {
  auto cpu = make_backend("cpu");
  auto reference = make_backend("reference");
  int compared = 0;
  for (OpKind kind : kComputeOpKinds) {
    for (DType dtype : {DType::f32, DType::bf16, DType::f16}) {
      if (!cpu->supports(kind, dtype) || !reference->supports(kind, dtype)) continue;
      const std::string what = fmt::format("{} ({})", op_kind_name(kind), dtype_name(dtype));
      ProgramFixture probe;
      if (dtype != DType::f32 || build_case(kind, probe) < 0) {
        ADD_FAILURE() << what << ": both backends support it but it has no parity case";
        continue;
      }
      const Outputs a = run_case(*cpu, kind), b = run_case(*reference, kind);
      ASSERT_EQ(a.floats.size(), b.floats.size()) << what;
      for (size_t j = 0; j < a.floats.size(); ++j)
        EXPECT_LE(test::normalized_error(a.floats[j], b.floats[j]), kParityTol) << what << " float output " << j;
      for (size_t j = 0; j < a.codes.size(); ++j) {
        size_t differ = 0;
        for (size_t i = 0; i < a.codes[j].size(); ++i)
          if (a.codes[j][i] != b.codes[j][i]) {
            ++differ;
            EXPECT_LE(std::abs(int(a.codes[j][i]) - int(b.codes[j][i])), 1) << what;
          }
        EXPECT_LE(double(differ), kCodeMismatchShare * double(a.codes[j].size())) << what << " code output " << j;
      }
      ++compared;
    }
  }
  // Every compute kind but check_finite (fp16 runs only, no reference kernel) in fp32.
  EXPECT_EQ(compared, int(std::size(kComputeOpKinds)) - 1);
}

TEST(BackendParity, TheReferenceBackendRefusesWhatItDoesNotDeclare) {
  auto reference = make_backend("reference");
  EXPECT_FALSE(reference->supports(OpKind::matmul, DType::bf16));
  EXPECT_FALSE(reference->supports(OpKind::check_finite, DType::f32));
  ProgramFixture f;
  MatmulAttrs a;
  a.m = 4, a.n = 4, a.k = 8;
  const int op = f.op(OpKind::matmul, {f.tensor("a", {4, 8}, DType::bf16), f.tensor("b", {8, 4}, DType::bf16)},
                      {f.tensor("c", {4, 4}, DType::bf16)}, a);
  try {
    f.prepare(*reference, op);
    ADD_FAILURE() << "a bf16 matmul was prepared";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no reference kernel for matmul (bf16)"), std::string::npos) << e.what();
  }
}

TEST(BackendParity, BackendsAreChosenByNameInOnePlace) {
  EXPECT_EQ(make_backend("cpu")->name(), "cpu");
  EXPECT_EQ(make_backend("reference")->name(), "reference");
  try {
    make_backend("cuda");
    ADD_FAILURE() << "an unknown backend was made";
  } catch (const Error& e) {
    EXPECT_EQ(e.piece(), "kernels");
    EXPECT_NE(std::string(e.what()).find("unknown backend 'cuda' (backends: cpu, reference)"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace memfit
