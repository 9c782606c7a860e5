// LoRA's adapter products on a TinyLlama layer's shapes (N = 1024 tokens, rank 16; inputs
// and outputs of 2048, 256 and 5632), each through oneDNN and through the skinny bf16 kernels
// (kernels/cpu/skinny_bf16.hpp; the weight gradients run oneDNN in both columns), with the threads OMP_NUM_THREADS gives: best-of-repeats ms
// and GFLOP/s per product, and the sum over one layer's 7 adapters.
//   lora_products_bench [tokens=1024] [rank=16] [repeats=20]   (LORA_BENCH_WARM=1: caches kept warm)
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "core/half.hpp"
#include "kernels/cpu/matmul.hpp"

using namespace memfit;

namespace {

// Caches flushed before each timed run (LORA_BENCH_WARM=1 keeps them): in a training step
// each adapter product reads activations another op wrote long before.
void flush_caches() {
  static const bool warm = [] {
    const char* v = std::getenv("LORA_BENCH_WARM");
    return v && *v == '1';
  }();
  if (warm) return;
  static std::vector<char> junk(size_t(96) << 20);
  for (size_t i = 0; i < junk.size(); i += 64) junk[i] = char(junk[i] + 1);
}

double now_ms() {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

struct Product {
  std::string name;
  MatmulAttrs attrs;
  DType c;
  bool accumulate;
};

double time_dnnl(const DnnlEnv& env, const Product& p, const void* a, const void* b, void* c, int repeats) {
  const MatmulTypes t{DType::bf16, DType::bf16, DType::f32, p.c};
  DnnlMatmul prim(env, matmul_spec(p.attrs, false, p.accumulate, t));
  std::vector<std::byte> scratch(DnnlMatmul::scratch_bytes(env, matmul_spec(p.attrs, false, p.accumulate, t)) + 64);
  prim.bind(a, b, nullptr, c, scratch.data());
  double best = 1e30;
  for (int r = 0; r < repeats; ++r) {
    flush_caches();
    const double t0 = now_ms();
    prim.execute();
    best = std::min(best, now_ms() - t0);
  }
  return best;
}

double time_skinny(const Product& p, const void* a, const void* b, void* c, int repeats) {
  std::vector<std::byte> scratch(skinny_bf16_scratch_bytes(p.attrs) + 64);
  double best = 1e30;
  for (int r = 0; r < repeats; ++r) {
    flush_caches();
    const double t0 = now_ms();
    skinny_bf16_matmul(p.attrs, static_cast<const uint16_t*>(a), static_cast<const uint16_t*>(b), c,
                       p.c == DType::bf16, p.accumulate, scratch.data());
    best = std::min(best, now_ms() - t0);
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t N = argc > 1 ? std::atoll(argv[1]) : 1024, r = argc > 2 ? std::atoll(argv[2]) : 16;
  const int repeats = argc > 3 ? std::atoi(argv[3]) : 20;
  const float s = 0.5f;
  // (in, out) of q, k, v, o, gate, up, down.
  const std::vector<std::pair<int64_t, int64_t>> modules = {{2048, 2048}, {2048, 256}, {2048, 256}, {2048, 2048},
                                                            {2048, 5632}, {2048, 5632}, {5632, 2048}};
  const DnnlEnv env = DnnlEnv::make_cpu();
  std::vector<bf16_t> big(size_t(N * 5632 + 5632 * 64), narrow<bf16_t>(0.01f)), big2 = big;
  std::vector<float> out(size_t(N * 5632));
  std::printf("threads %d, tokens %lld, rank %lld\n", omp_get_max_threads(), (long long)N, (long long)r);
  std::printf("%-32s %10s %10s %8s %8s\n", "product", "oneDNN ms", "memfit ms", "GF/s dnn", "GF/s new");
  double total_dnnl = 0, total_skinny = 0;
  for (const auto& [in, o] : modules) {
    const std::vector<Product> products = {
        {"x A^T         " + std::to_string(in), {N, r, in, false, true, 1.0f}, DType::bf16, false},
        {"s xa B^T      " + std::to_string(o), {N, o, r, false, true, s}, DType::bf16, false},
        {"dxa = s dy B  " + std::to_string(o), {N, r, o, false, false, s}, DType::bf16, false},
        {"dB = s dy^T xa " + std::to_string(o), {o, r, N, true, false, s}, DType::f32, false},
        {"dx += u A     " + std::to_string(in), {N, in, r, false, false, 1.0f}, DType::bf16, true},
        {"dA = u^T x    " + std::to_string(in), {r, in, N, true, false, 1.0f}, DType::f32, false},
    };
    for (const Product& p : products) {
      const double d = time_dnnl(env, p, big.data(), big2.data(), out.data(), repeats);
      // Weight gradients run oneDNN either way (skinny_bf16.hpp): the same primitive twice.
      const double k = p.attrs.trans_a ? time_dnnl(env, p, big.data(), big2.data(), out.data(), repeats)
                                       : time_skinny(p, big.data(), big2.data(), out.data(), repeats);
      const double gf = 2.0 * double(p.attrs.m) * double(p.attrs.n) * double(p.attrs.k) * 1e-6;
      std::printf("%-32s %10.3f %10.3f %8.1f %8.1f\n", p.name.c_str(), d, k, gf / d, gf / k);
      total_dnnl += d, total_skinny += k;
    }
  }
  std::printf("one layer's adapters: oneDNN %.2f ms, memfit %.2f ms (%.2fx)\n", total_dnnl, total_skinny,
              total_dnnl / total_skinny);
  return 0;
}
