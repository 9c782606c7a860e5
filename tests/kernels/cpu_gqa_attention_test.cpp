// Grouped-query attention (kv_heads KV < heads H; qkv (B, T, (H + 2KV) HS)) in the plain and
// flash CPU kernels, four ways:
// - the references' GQA backward against finite differences of their forward (double), and
//   the references' GQA against their own MHA run on qkv whose kv heads were repeated G = H/KV
//   times (which is what GQA means: HF's repeat_kv);
// - the kernels through the backend against the references, for H = 4, KV = 2; H = 6, KV = 2;
//   and KV = 1 (multi-query), at T inside one tile, one row past a flash tile (65), and ragged
//   in both tile sizes (48 plain, 64 flash); fp32 for both forms, bf16 and fp16 for flash;
//   both write modes of the outputs that have them;
// - each kernel's GQA against the same kernel's MHA on the repeated qkv (an oracle that
//   shares no GQA indexing with the kernel): y, probs / lse and dq equal, dk and dv of kv head
//   j equal the sums over its query heads of the MHA run's dk and dv;
// - the backward kernels give the same bits on 1, 2 and 3 threads with a GQA shape (the group
//   sums of dk, dv are taken in one fixed order).
// The bf16 plain path (oneDNN) has no GQA and must say so.
//
// Tolerances (max |kernel - ref| / max |ref|), as in cpu_gemm_ops_test and cpu_lowp_test:
// fp32 1e-5; a 16-bit output rounded once from fp32 sums (flash rounds each stored element
// once, dk and dv after their group sum) 2^-8 for bf16, 2^-10 for fp16. fp16 tiles are fp32
// from the widened inputs; bf16 tiles, with AVX512-BF16, multiply bf16 operands into fp32 sums,
// the probabilities and dS rounded to bf16 (2^-9 per term) as they enter a product (measured
// up to 3.5e-3 here; flash_attention_bf16_test); the repeated-MHA oracle in bf16 rounds each of the G
// terms of a group sum, 2^-6. An indexing error (the wrong kv head) gives errors of order 1.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "core/error.hpp"
#include "core/half.hpp"
#include "kernel_test_util.hpp"
#include "kernels/backend.hpp"
#include "kernels/cpu/attention.hpp"
#include "kernels/cpu/attention_tiles.hpp"
#include "kernels/cpu/flash_attention.hpp"
#include "kernels/reference/reference.hpp"
#include "program_fixture.hpp"

namespace memfit {
namespace {

using test::normalized_error;
using test::random_vector;
using Vec = std::vector<float>;
using DVec = std::vector<double>;

constexpr double kFp32Tol = 1e-5;
double tol16(DType t) { return t == DType::bf16 ? 0x1p-8 : 0x1p-10; }
double tol(DType t) { return t == DType::f32 ? kFp32Tol : tol16(t); }
constexpr double kGroupSumOf16Bit = 0x1p-6;

struct Gqa {
  int64_t B, T, H, KV, HS;
  int64_t G() const { return H / KV; }
  int64_t C() const { return H * HS; }
  int64_t W() const { return (H + 2 * KV) * HS; }  // a row of qkv
  std::string str() const { return fmt::format("B={} T={} H={} KV={} HS={}", B, T, H, KV, HS); }
};

AttentionAttrs attrs(const Gqa& c) {
  AttentionAttrs a;
  a.batch = c.B, a.seq = c.T, a.heads = c.H, a.kv_heads = c.KV, a.head_dim = c.HS;
  a.scale = 1.0f / std::sqrt(float(c.HS));
  return a;
}

// The MHA shape of the same attention: every query head with its own (repeated) kv head.
Gqa mha(const Gqa& c) { return Gqa{c.B, c.T, c.H, c.H, c.HS}; }

// qkv (B, T, (H + 2KV) HS) -> (B, T, 3 H HS): kv head j copied to heads j G .. j G + G - 1.
template <class F>
std::vector<F> repeat_kv(const std::vector<F>& qkv, const Gqa& c) {
  const int64_t HS = c.HS, W = c.W(), C = c.C();
  std::vector<F> out(size_t(c.B * c.T * 3 * C));
  for (int64_t n = 0; n < c.B * c.T; ++n) {
    const F* src = qkv.data() + n * W;
    F* dst = out.data() + n * 3 * C;
    for (int64_t h = 0; h < c.H; ++h)
      for (int64_t d = 0; d < HS; ++d) {
        const int64_t j = h / c.G();
        dst[h * HS + d] = src[h * HS + d];
        dst[C + h * HS + d] = src[(c.H + j) * HS + d];
        dst[2 * C + h * HS + d] = src[(c.H + c.KV + j) * HS + d];
      }
  }
  return out;
}

// The inverse for gradients: dq copied, dk and dv of kv head j the sums over its query heads.
template <class F>
std::vector<F> sum_groups(const std::vector<F>& dqkv_mha, const Gqa& c) {
  const int64_t HS = c.HS, W = c.W(), C = c.C();
  std::vector<F> out(size_t(c.B * c.T * W), F(0));
  for (int64_t n = 0; n < c.B * c.T; ++n) {
    const F* src = dqkv_mha.data() + n * 3 * C;
    F* dst = out.data() + n * W;
    for (int64_t h = 0; h < c.H; ++h)
      for (int64_t d = 0; d < HS; ++d) {
        const int64_t j = h / c.G();
        dst[h * HS + d] = src[h * HS + d];
        dst[(c.H + j) * HS + d] += src[C + h * HS + d];
        dst[(c.H + c.KV + j) * HS + d] += src[2 * C + h * HS + d];
      }
  }
  return out;
}

// ---------------------------------------------------------------------------------------
// The references.

using test::dot;
using test::kGradTol;
using test::numeric_grad;

const Gqa kSmall[] = {{2, 5, 4, 2, 3}, {1, 6, 6, 2, 2}, {2, 4, 3, 1, 3}};

TEST(GqaReferenceGradcheck, PlainAttention) {
  for (const Gqa& c : kSmall) {
    SCOPED_TRACE(c.str());
    const double scale = 1.0 / std::sqrt(double(c.HS));
    DVec qkv = random_vector<double>(c.B * c.T * c.W(), 40, -1.5, 1.5);
    const DVec G = random_vector<double>(c.B * c.T * c.C(), 41);
    DVec y(c.B * c.T * c.C()), probs(c.B * c.H * c.T * c.T);
    auto objective = [&] {
      ref::attention_forward(qkv.data(), y.data(), probs.data(), c.B, c.T, c.H, c.HS, scale, false, c.KV);
      return dot(G, y);
    };
    objective();
    DVec dqkv(qkv.size(), 3.0);  // overwrite mode must replace the 3s
    ref::attention_backward(G.data(), qkv.data(), probs.data(), dqkv.data(), c.B, c.T, c.H, c.HS, scale, false, c.KV);
    EXPECT_LE(normalized_error(dqkv, numeric_grad(qkv, objective)), kGradTol);
  }
}

TEST(GqaReferenceGradcheck, FlashAttention) {
  for (const Gqa& c : kSmall) {
    SCOPED_TRACE(c.str());
    const double scale = 1.0 / std::sqrt(double(c.HS));
    DVec qkv = random_vector<double>(c.B * c.T * c.W(), 42, -1.5, 1.5);
    const DVec G = random_vector<double>(c.B * c.T * c.C(), 43);
    DVec y(c.B * c.T * c.C()), lse(c.B * c.H * c.T);
    auto objective = [&] {
      ref::flash_attention_forward(qkv.data(), y.data(), lse.data(), c.B, c.T, c.H, c.HS, scale, c.KV);
      return dot(G, y);
    };
    objective();
    DVec dqkv(qkv.size(), 3.0);
    ref::flash_attention_backward(G.data(), qkv.data(), y.data(), lse.data(), dqkv.data(), c.B, c.T, c.H, c.HS, scale,
                                  false, c.KV);
    EXPECT_LE(normalized_error(dqkv, numeric_grad(qkv, objective)), kGradTol);
  }
}

TEST(GqaReference, EqualsMhaOnRepeatedKvHeads) {
  for (const Gqa& c : kSmall) {
    SCOPED_TRACE(c.str());
    const double scale = 0.45;
    const DVec qkv = random_vector<double>(c.B * c.T * c.W(), 44, -2, 2), dy = random_vector<double>(c.B * c.T * c.C(), 45);
    const DVec rep = repeat_kv(qkv, c);
    const int64_t N = c.B * c.T;
    DVec y(N * c.C()), probs(c.B * c.H * c.T * c.T), dqkv(qkv.size());
    DVec my(N * c.C()), mprobs(probs.size()), mdqkv(rep.size());
    ref::attention_forward(qkv.data(), y.data(), probs.data(), c.B, c.T, c.H, c.HS, scale, false, c.KV);
    ref::attention_backward(dy.data(), qkv.data(), probs.data(), dqkv.data(), c.B, c.T, c.H, c.HS, scale, false, c.KV);
    ref::attention_forward(rep.data(), my.data(), mprobs.data(), c.B, c.T, c.H, c.HS, scale, false);
    ref::attention_backward(dy.data(), rep.data(), mprobs.data(), mdqkv.data(), c.B, c.T, c.H, c.HS, scale, false);
    EXPECT_LE(normalized_error(y, my), 1e-13);
    EXPECT_LE(normalized_error(probs, mprobs), 1e-13);
    EXPECT_LE(normalized_error(dqkv, sum_groups(mdqkv, c)), 1e-13);
    // The flash reference agrees with the plain one on the grouped shape too.
    DVec fy(N * c.C()), lse(c.B * c.H * c.T), fdqkv(qkv.size());
    ref::flash_attention_forward(qkv.data(), fy.data(), lse.data(), c.B, c.T, c.H, c.HS, scale, c.KV);
    ref::flash_attention_backward(dy.data(), qkv.data(), fy.data(), lse.data(), fdqkv.data(), c.B, c.T, c.H, c.HS,
                                  scale, false, c.KV);
    EXPECT_LE(normalized_error(fy, y), 1e-13);
    EXPECT_LE(normalized_error(fdqkv, dqkv), 1e-13);
  }
}

// ---------------------------------------------------------------------------------------
// The kernels, through the backend.

// A ProgramFixture whose tensors are written from and read as fp32, whatever their dtype.
struct Fixture : test::ProgramFixture {
  explicit Fixture(const std::string& name) : backend(make_backend(name)) {}
  std::unique_ptr<Backend> backend;
  TensorId make(const std::string& name, Shape shape, DType dtype, const Vec& values) {
    const TensorId id = tensor(name, std::move(shape), dtype);
    visit_float_type(dtype, [&](auto t) {
      using T = decltype(t);
      T* d = data<T>(id);
      for (size_t i = 0; i < values.size(); ++i) d[i] = narrow<T>(values[i]);
    });
    return id;
  }
  Vec read(TensorId id) {
    Vec out(size_t(program.tensor(id).numel()));
    visit_float_type(program.tensor(id).dtype, [&](auto t) {
      using T = decltype(t);
      const T* d = data<T>(id);
      for (size_t i = 0; i < out.size(); ++i) out[i] = widen(d[i]);
    });
    return out;
  }
  void run(int op) { prepare(*backend, op)->run(StepContext{}); }
};

// What a forward and backward produced: y, probs (plain) or lse (flash), dqkv; and the inputs
// as rounded to the dtype (what a reference must be given).
struct Run {
  Vec y, stat, dqkv;
  Vec qkv, dy, y0, dqkv0;
};

// Forward then backward of `c` (GQA when c.KV < c.H) on the given inputs. The plain forward
// writes y in `mode`; flash's forward always overwrites. Both backwards write dqkv in `mode`.
Run run_kernel(bool flash, DType dt, const Gqa& c, const Vec& qkv, const Vec& dy, const Vec& y0, const Vec& dqkv0,
               WriteMode mode, const std::string& backend = "cpu") {
  Fixture f(backend);
  const int64_t B = c.B, T = c.T, H = c.H, C = c.C(), W = c.W();
  const AttentionAttrs a = attrs(c);
  const TensorId tq = f.make("qkv", {B, T, W}, dt, qkv), ty = f.make("y", {B, T, C}, dt, y0);
  const TensorId tdy = f.make("dy", {B, T, C}, dt, dy), tdq = f.make("dqkv", {B, T, W}, dt, dqkv0);
  Run r;
  r.qkv = f.read(tq), r.dy = f.read(tdy), r.y0 = f.read(ty), r.dqkv0 = f.read(tdq);
  TensorId stat;
  if (flash) {
    stat = f.tensor("lse", {B, H, T});
    f.run(f.op(OpKind::flash_attention_forward, {tq}, {ty, stat}, a, {WriteMode::overwrite, WriteMode::overwrite}));
    f.run(f.op(OpKind::flash_attention_backward, {tdy, tq, ty, stat}, {tdq}, a, {mode}));
  } else {
    // probs starts as garbage: the masked entries must be written as exact zeros.
    stat = f.make("probs", {B, H, T, T}, dt, random_vector(B * H * T * T, 9));
    const TensorId tdp = f.tensor("dprobs", {B, H, T, T});
    f.run(f.op(OpKind::attention_forward, {tq}, {ty, stat}, a, {mode, WriteMode::overwrite}));
    f.run(f.op(OpKind::attention_backward, {tdy, tq, stat}, {tdq}, a, {mode}, {tdp}));
  }
  r.y = f.read(ty), r.stat = f.read(stat), r.dqkv = f.read(tdq);
  return r;
}

Run run_random(bool flash, DType dt, const Gqa& c, WriteMode mode, uint32_t seed, const std::string& backend = "cpu") {
  const int64_t N = c.B * c.T;
  return run_kernel(flash, dt, c, random_vector(N * c.W(), seed, -2, 2), random_vector(N * c.C(), seed + 1),
                    random_vector(N * c.C(), seed + 2), random_vector(N * c.W(), seed + 3), mode, backend);
}

// The references (double) on exactly the inputs the kernel saw.
void expect_matches_reference(bool flash, DType dt, const Gqa& c, WriteMode mode, uint32_t seed,
                              const std::string& backend = "cpu") {
  const std::string what =
      fmt::format("{}: {} {} {} mode={}", backend, flash ? "flash" : "plain", dtype_name(dt), c.str(), int(mode));
  SCOPED_TRACE(what);
  const Run k = run_random(flash, dt, c, mode, seed, backend);
  const bool acc = mode == WriteMode::accumulate;
  const double scale = double(attrs(c).scale);
  DVec y = test::to_double(k.y0), stat, dqkv = test::to_double(k.dqkv0);
  const DVec qkv = test::to_double(k.qkv), dy = test::to_double(k.dy);
  if (flash) {
    stat.resize(size_t(c.B * c.H * c.T));
    ref::flash_attention_forward(qkv.data(), y.data(), stat.data(), c.B, c.T, c.H, c.HS, scale, c.KV);
    ref::flash_attention_backward(dy.data(), qkv.data(), y.data(), stat.data(), dqkv.data(), c.B, c.T, c.H, c.HS,
                                  scale, acc, c.KV);
  } else {
    stat.resize(size_t(c.B * c.H * c.T * c.T));
    ref::attention_forward(qkv.data(), y.data(), stat.data(), c.B, c.T, c.H, c.HS, scale, acc, c.KV);
    ref::attention_backward(dy.data(), qkv.data(), stat.data(), dqkv.data(), c.B, c.T, c.H, c.HS, scale, acc, c.KV);
  }
  const double ey = normalized_error(k.y, y), es = normalized_error(k.stat, stat), ed = normalized_error(k.dqkv, dqkv);
  std::printf("%s: normalised error y %.2g, %s %.2g, dqkv %.2g\n", what.c_str(), ey, flash ? "lse" : "probs", es, ed);
  EXPECT_LE(ey, tol(dt));
  EXPECT_LE(es, flash ? kFp32Tol : tol(dt));  // lse is fp32 in every dtype
  EXPECT_LE(ed, tol(dt));
  if (flash) return;
  for (int64_t r = 0; r < c.B * c.H * c.T; ++r)
    for (int64_t s = r % c.T + 1; s < c.T; ++s) ASSERT_EQ(k.stat[size_t(r * c.T + s)], 0.0f) << "row " << r << " col " << s;
}

// T = 7 and 33: inside one tile; 65: one row past a 64-row flash tile, ragged in the plain
// kernel's 48-row blocks; 100 and 130: ragged last tiles in both (64 + 36, 64 + 64 + 2;
// 48 + 48 + 4, 48 + 48 + 34). KV = 1: multi-query.
const Gqa kShapes[] = {{2, 7, 4, 2, 8}, {1, 65, 6, 2, 16}, {1, 130, 4, 1, 8}, {2, 33, 6, 1, 5}, {1, 100, 6, 3, 12}};

// On every backend (kernels/backend.hpp), in every dtype it declares for the kind.
class GqaAttentionOnBackend : public ::testing::TestWithParam<std::string> {};
INSTANTIATE_TEST_SUITE_P(Backends, GqaAttentionOnBackend, ::testing::Values("cpu", "reference"),
                         [](const ::testing::TestParamInfo<std::string>& info) { return info.param; });

TEST_P(GqaAttentionOnBackend, PlainFp32MatchesReference) {
  uint32_t seed = 100;
  for (const Gqa& c : kShapes)
    for (WriteMode mode : {WriteMode::overwrite, WriteMode::accumulate})
      expect_matches_reference(false, DType::f32, c, mode, seed += 10, GetParam());
}

TEST_P(GqaAttentionOnBackend, FlashMatchesReferenceInEveryDtype) {
  uint32_t seed = 200;
  int dtypes = 0;
  for (DType dt : {DType::f32, DType::bf16, DType::f16}) {
    if (!make_backend(GetParam())->supports(OpKind::flash_attention_forward, dt)) continue;
    ++dtypes;
    for (const Gqa& c : kShapes)
      for (WriteMode mode : {WriteMode::overwrite, WriteMode::accumulate})
        expect_matches_reference(true, dt, c, mode, seed += 10, GetParam());
  }
  EXPECT_EQ(dtypes, GetParam() == "cpu" ? 3 : 1);
}

// GQA against the same kernel's MHA on repeated kv heads.
void expect_equals_repeated_mha(bool flash, DType dt, const Gqa& c, uint32_t seed) {
  const std::string what = fmt::format("{} {} {}", flash ? "flash" : "plain", dtype_name(dt), c.str());
  SCOPED_TRACE(what);
  const int64_t N = c.B * c.T;
  const Vec qkv = random_vector(N * c.W(), seed, -2, 2), dy = random_vector(N * c.C(), seed + 1);
  const Vec y0(N * c.C());
  const Run g = run_kernel(flash, dt, c, qkv, dy, y0, Vec(N * c.W()), WriteMode::overwrite);
  // The repetition of the rounded qkv is exact in any dtype.
  const Run m = run_kernel(flash, dt, mha(c), repeat_kv(g.qkv, c), dy, y0, Vec(N * 3 * c.C()), WriteMode::overwrite);
  const Vec expect = sum_groups(m.dqkv, c);
  const double ey = normalized_error(g.y, m.y), es = normalized_error(g.stat, m.stat);
  const double ed = normalized_error(g.dqkv, expect);
  std::printf("%s vs repeated MHA: y %.2g, %s %.2g, dqkv %.2g\n", what.c_str(), ey, flash ? "lse" : "probs", es, ed);
  // Per query head the forward does the same operations on the same values as the MHA run.
  EXPECT_EQ(ey, 0.0);
  EXPECT_EQ(es, 0.0);
  EXPECT_LE(ed, dt == DType::f32 ? kFp32Tol : kGroupSumOf16Bit);
  // dq involves no group sum: the same operations as the MHA run's dq (compare the q part).
  for (int64_t n = 0; n < N; ++n)
    for (int64_t i = 0; i < c.C(); ++i)
      ASSERT_EQ(g.dqkv[size_t(n * c.W() + i)], m.dqkv[size_t(n * 3 * c.C() + i)]) << "dq at " << n << ", " << i;
}

TEST(GqaAttentionKernel, EqualsMhaOnRepeatedKvHeads) {
  uint32_t seed = 300;
  for (const Gqa& c : kShapes) {
    expect_equals_repeated_mha(false, DType::f32, c, seed += 10);
    expect_equals_repeated_mha(true, DType::f32, c, seed += 10);
    expect_equals_repeated_mha(true, DType::bf16, c, seed += 10);
  }
}

TEST(GqaAttentionKernel, Bf16PlainAttentionRefusesGroupsNamingFlash) {
  const Gqa c{1, 8, 4, 2, 8};
  for (OpKind kind : {OpKind::attention_forward, OpKind::attention_backward}) {
    Fixture f("cpu");
    const TensorId q = f.tensor("qkv", {1, 8, c.W()}, DType::bf16), y = f.tensor("y", {1, 8, c.C()}, DType::bf16);
    const TensorId p = f.tensor("probs", {1, 4, 8, 8}, DType::bf16);
    const int op = kind == OpKind::attention_forward
                       ? f.op(kind, {q}, {y, p}, attrs(c), {WriteMode::overwrite, WriteMode::overwrite})
                       : f.op(kind, {y, q, p}, {f.tensor("dqkv", {1, 8, c.W()}, DType::bf16)}, attrs(c),
                              {WriteMode::overwrite}, {f.tensor("dprobs", {1, 4, 8, 8})});
    try {
      f.prepare(*f.backend, op);
      ADD_FAILURE() << op_kind_name(kind) << " accepted grouped kv heads in bf16";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("--attention flash"), std::string::npos) << e.what();
    }
  }
}

TEST(GqaAttentionKernel, RejectsHeadsNotAMultipleOfKvHeads) {
  AttentionAttrs a = attrs(Gqa{1, 4, 6, 4, 8});
  EXPECT_THROW(AttentionShape::of(a), Error);
  a.kv_heads = 8;  // more kv heads than query heads
  EXPECT_THROW(AttentionShape::of(a), Error);
  a.kv_heads = 3;
  EXPECT_EQ(AttentionShape::of(a).group(), 2);
}

// The backward of kv head j sums its G query heads in one order on one thread: the bits must
// not depend on the thread count (3 batches x 2 kv heads = 6 tasks, split 6, 3+3, 2+2+2).
TEST(GqaAttentionKernel, SameBitsOnAnyThreadCount) {
  const int saved = omp_get_max_threads();
  AttentionShape s = AttentionShape::of(attrs(Gqa{3, 70, 6, 2, 16}));
  const int64_t N = s.batch * s.seq, W = s.qkv_channels(), C = s.channels();
  const Vec qkv = random_vector(N * W, 50, -2, 2), dy = random_vector(N * C, 51);
  std::vector<Vec> outs;
  for (int threads : {1, 2, 3}) {
    omp_set_num_threads(threads);
    Vec out;
    {  // plain fp32
      Vec y(N * C), probs(s.batch * s.heads * s.seq * s.seq), dprobs(probs.size()), dqkv(N * W);
      std::vector<char> scratch(attention_tiles_scratch_bytes(s, threads) + 64);
      attention_forward_tiles(s, qkv.data(), y.data(), probs.data(), false, scratch.data(), threads);
      attention_backward_tiles(s, dy.data(), qkv.data(), probs.data(), dqkv.data(), dprobs.data(), false,
                               scratch.data(), threads);
      out.insert(out.end(), y.begin(), y.end());
      out.insert(out.end(), dqkv.begin(), dqkv.end());
    }
    {  // flash fp32
      Vec y(N * C), lse(s.batch * s.heads * s.seq), dqkv(N * W);
      std::vector<char> scratch(std::max(flash_forward_scratch_bytes(s, threads), flash_backward_scratch_bytes(s, threads)) + 64);
      flash_attention_forward(s, qkv.data(), y.data(), lse.data(), scratch.data(), threads);
      flash_attention_backward(s, dy.data(), qkv.data(), y.data(), lse.data(), dqkv.data(), false, scratch.data(),
                               threads);
      out.insert(out.end(), y.begin(), y.end());
      out.insert(out.end(), lse.begin(), lse.end());
      out.insert(out.end(), dqkv.begin(), dqkv.end());
    }
    outs.push_back(std::move(out));
  }
  omp_set_num_threads(saved);
  for (size_t i = 1; i < outs.size(); ++i) {
    ASSERT_EQ(outs[i].size(), outs[0].size());
    for (size_t j = 0; j < outs[0].size(); ++j) ASSERT_EQ(outs[i][j], outs[0][j]) << "threads " << i + 1 << " at " << j;
  }
}

// The flash backward's scratch holds D and dq for each of a group's query heads; the planner
// must be told (the kernel asserts it never carves more than flash_backward_scratch_bytes).
TEST(GqaAttentionKernel, FlashBackwardScratchCountsTheGroup) {
  AttentionShape mha_shape = AttentionShape::of(attrs(Gqa{1, 256, 8, 8, 64}));
  AttentionShape gqa_shape = AttentionShape::of(attrs(Gqa{1, 256, 8, 2, 64}));
  EXPECT_GT(flash_backward_scratch_bytes(gqa_shape, 1), flash_backward_scratch_bytes(mha_shape, 1));
  EXPECT_GE(flash_backward_scratch_bytes(gqa_shape, 1), uint64_t(4) * (256 * 64 + 256) * sizeof(float));
}

}  // namespace
}  // namespace memfit
