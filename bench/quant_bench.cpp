// What quantised frozen weights cost on the CPU (kernels/quant). For each linear shape of a
// TinyLlama-1.1B layer (hidden 2048, intermediate 5632, 4 KV heads of 64) it times, with the
// threads OMP_NUM_THREADS gives:
//   - quantise: bf16 -> NF4 codes + absmax + double quantisation (a load-time cost), ns/element;
//   - dequantise: NF4 (double-quantised) -> bf16, the whole weight, GB/s of bf16 written;
//   - forward y = x W^T and input grad dx = dy W of m tokens through CpuQuantLinear, for several
//     tile heights, against the same product on a plain bf16 W (one oneDNN matmul): the ratio
//     is what dequantising tile by tile adds, and the tile bytes are what the plan holds.
// Expect the ratio to fall as m grows (dequantisation is O(rows cols), the product O(m rows
// cols)) and to rise for very small tiles (one oneDNN call per tile).
//   quant_bench [m=1024] [repeats=5]        (quant_bench smoke: tiny shapes, one repeat)
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/dnnl_matmul.hpp"
#include "kernels/quant/blockwise.hpp"
#include "kernels/quant/cpu_quant_linear.hpp"

using Clock = std::chrono::steady_clock;
using namespace memfit;

namespace {

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

template <class F>
double best_of(int repeats, F&& f) {
  double best = 1e30;
  for (int r = 0; r < repeats; ++r) {
    const auto t0 = Clock::now();
    f();
    best = std::min(best, seconds_since(t0));
  }
  return best;
}

std::vector<bf16_t> random_bf16(size_t n, uint32_t seed, float scale) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<bf16_t> v(n);
  for (auto& x : v) x = round_to_bf16(dist(gen));
  return v;
}

void bench_shape(const char* name, int64_t m, int64_t rows, int64_t cols, int repeats, const DnnlEnv& env) {
  const int64_t numel = rows * cols;
  const auto w = random_bf16(size_t(numel), 1, 0.02f);
  const QuantSpec spec{QuantKind::nf4, 64, true};
  const QuantStorage storage = quant_storage(spec, numel);
  std::vector<uint8_t> codes(storage.codes), absmax_codes(storage.absmax);
  std::vector<float> absmax(size_t(quant_blocks(numel, spec.block))), absmax2(storage.absmax2 / 4);
  float offset = 0.0f;
  const double quantise_s = best_of(repeats, [&] {
    quantize_4bit<bf16_t>(w, spec, codes, absmax);
    offset = double_quantize_absmax(absmax, absmax_codes, absmax2);
  });
  const QuantizedWeight qw{spec, rows, cols, codes, {}, absmax_codes, absmax2, offset};
  std::vector<bf16_t> full(static_cast<size_t>(numel));
  const double dequantise_s = best_of(repeats, [&] { dequantize_range<bf16_t>(qw, 0, numel, full); });
  std::printf("%-10s [%lld, %lld]: quantise %.2f ns/elem, dequantise %.2f GB/s bf16, %.3f bits/param\n", name,
              (long long)rows, (long long)cols, quantise_s * 1e9 / double(numel),
              double(numel) * 2 / dequantise_s / 1e9, double(storage.total()) * 8 / double(numel));

  // Plain bf16 products on the expanded weight: the floor.
  const auto x = random_bf16(size_t(m * cols), 2, 1.0f), dy = random_bf16(size_t(m * rows), 3, 1.0f);
  std::vector<bf16_t> y(size_t(m * rows));
  std::vector<float> dx(size_t(m * cols));
  using dt = dnnl::memory::data_type;
  DnnlMatmulSpec fwd_spec, grad_spec;
  fwd_spec.src = dnnl_matrix(m, cols, false, dt::bf16);
  fwd_spec.wei = dnnl_matrix(cols, rows, true, dt::bf16);  // W [rows, cols] read as W^T
  fwd_spec.dst = dnnl_matrix(m, rows, false, dt::bf16);
  grad_spec.src = dnnl_matrix(m, rows, false, dt::bf16);
  grad_spec.wei = dnnl_matrix(rows, cols, false, dt::bf16);
  grad_spec.dst = dnnl_matrix(m, cols, false, dt::f32);
  DnnlMatmul plain_fwd(env, fwd_spec), plain_grad(env, grad_spec);
  std::vector<std::byte> plain_scratch(std::max(plain_fwd.scratch_bytes(), plain_grad.scratch_bytes()));
  plain_fwd.bind(x.data(), full.data(), nullptr, y.data(), plain_scratch.data());
  plain_grad.bind(dy.data(), full.data(), nullptr, dx.data(), plain_scratch.data());
  const double plain_fwd_s = best_of(repeats, [&] { plain_fwd.execute(); });
  const double plain_grad_s = best_of(repeats, [&] { plain_grad.execute(); });

  for (int64_t tile_rows : {int64_t(16), int64_t(64), int64_t(256), int64_t(1024), rows}) {
    if (tile_rows > rows) continue;
    CpuQuantLinear product(env, QuantLinearShape{m, rows, cols, tile_rows, DType::bf16});
    std::vector<bf16_t> tile(size_t(product.tile_elements()));
    std::vector<std::byte> scratch(product.scratch_bytes());
    const double fwd_s = best_of(repeats, [&] { product.forward<bf16_t>(x, qw, tile, scratch, y); });
    const double grad_s = best_of(repeats, [&] { product.input_grad<bf16_t>(dy, qw, tile, scratch, dx); });
    std::printf("  m %lld tile %5lld rows (%7.1f KiB): forward %.2f ms (plain %.2f, x%.2f), input grad %.2f ms "
                "(plain %.2f, x%.2f)\n",
                (long long)m, (long long)tile_rows, double(tile.size() * 2) / 1024, fwd_s * 1e3, plain_fwd_s * 1e3,
                fwd_s / plain_fwd_s, grad_s * 1e3, plain_grad_s * 1e3, grad_s / plain_grad_s);
  }
}

}  // namespace

int main(int argc, char** argv) {
  const bool smoke = argc > 1 && std::strcmp(argv[1], "smoke") == 0;
  const int64_t m = smoke ? 8 : argc > 1 ? std::atoll(argv[1]) : 1024;
  const int repeats = smoke ? 1 : argc > 2 ? std::atoi(argv[2]) : 5;
  const DnnlEnv env = DnnlEnv::make_cpu();
  if (smoke) {
    bench_shape("smoke", m, 96, 64, repeats, env);
    return 0;
  }
  bench_shape("q_proj", m, 2048, 2048, repeats, env);
  bench_shape("k_proj", m, 256, 2048, repeats, env);
  bench_shape("gate_proj", m, 5632, 2048, repeats, env);
  bench_shape("down_proj", m, 2048, 5632, repeats, env);
  return 0;
}
