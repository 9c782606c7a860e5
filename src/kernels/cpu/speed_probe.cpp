// Timings for the "cpu" hardware's step-time model (see speed_probe.hpp). Each figure is the
// best of kRuns timed runs: the model wants what the kernel can do, not what a neighbour's
// burst of load left of it.
#include "kernels/cpu/speed_probe.hpp"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <vector>

#include "core/error.hpp"
#include "graph/op.hpp"
#include "kernels/cpu/matmul.hpp"
#include "kernels/cpu/parallel.hpp"

namespace memfit {
namespace {

constexpr int kRuns = 4;

template <class F>
double best_seconds(const F& f) {
  f();  // warm-up: JIT, first touch of the operands
  double best = 1e30;
  for (int r = 0; r < kRuns; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

// Zeroed, 64-byte aligned bytes, as the arena hands kernels their operands and scratch.
struct AlignedBytes {
  std::unique_ptr<char, decltype(&std::free)> p{nullptr, &std::free};
  explicit AlignedBytes(uint64_t n) {
    const uint64_t rounded = std::max<uint64_t>(64, (n + 63) / 64 * 64);
    p.reset(static_cast<char*>(std::aligned_alloc(64, rounded)));
    MEMFIT_CHECK(p != nullptr, "kernels", "the speed probe cannot allocate {} bytes", rounded);
    std::fill_n(p.get(), rounded, char(0));  // zero is a zero of every float type, never denormal
  }
};

// FLOP/s of one product through MatmulKernel; elem_ab and elem_c are the operands' byte widths.
double product_flops(const DnnlEnv& env, const MatmulAttrs& attrs, const MatmulTypes& types, int elem_ab, int elem_c) {
  const WriteVariants variants{true, false};
  AlignedBytes a(uint64_t(attrs.m * attrs.k * elem_ab)), b(uint64_t(attrs.k * attrs.n * elem_ab));
  AlignedBytes c(uint64_t(attrs.m * attrs.n * elem_c));
  AlignedBytes scratch(MatmulKernel::scratch_bytes(env, attrs, false, variants, types));
  MatmulKernel k(env, attrs, false, variants, types);
  k.bind(a.p.get(), b.p.get(), nullptr, c.p.get(), scratch.p.get());
  const double s = best_seconds([&] { k.run(false); });
  return 2.0 * double(attrs.m) * double(attrs.n) * double(attrs.k) / s;
}

double stream_bytes_per_s() {
  // 3 x 64 MiB, well past the last-level cache, updated like AdamW's moments: read two, write one.
  const int64_t n = int64_t(16) << 20;
  std::vector<float> x(size_t(n), 1.0f), y(size_t(n), 2.0f), z(size_t(n), 0.0f);
  const double s = best_seconds([&] {
    parallel_for(n, kParallelGrain, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) z[size_t(i)] = 0.9f * z[size_t(i)] + 0.1f * x[size_t(i)] * y[size_t(i)];
    });
  });
  return 4.0 * double(n) * sizeof(float) / s;  // x, y, z read; z written
}

}  // namespace

CpuSpeed probe_cpu_speed() {
  const DnnlEnv env = DnnlEnv::make_cpu();
  MatmulAttrs forward;
  forward.m = 1024, forward.k = 768, forward.n = 3072, forward.trans_b = true;
  MatmulAttrs backward_input;
  backward_input.m = 1024, backward_input.k = 3072, backward_input.n = 768;
  CpuSpeed s;
  s.fp32_gemm_flops = std::min(product_flops(env, forward, {}, 4, 4), product_flops(env, backward_input, {}, 4, 4));
  const MatmulTypes bf16{DType::bf16, DType::bf16, DType::bf16, DType::bf16};
  try {
    s.bf16_gemm_flops = product_flops(env, forward, bf16, 2, 2);
  } catch (const dnnl::error&) {
    s.bf16_gemm_flops = 0;  // oneDNN has no bf16 product for this CPU; the caller says so
  }
  s.stream_bytes_per_s = stream_bytes_per_s();
  MEMFIT_CHECK(s.fp32_gemm_flops > 0 && s.stream_bytes_per_s > 0, "kernels", "the speed probe measured a zero rate");
  return s;
}

}  // namespace memfit
