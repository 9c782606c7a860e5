// The CPU flash attention kernel (kernels/cpu/flash_attention.cpp) alone, on a TinyLlama
// layer's shape by default (batch 4, sequence 256, 32 query heads, 4 kv heads of 64), with the
// threads OMP_NUM_THREADS gives: forward and backward ms (best of the repeats) in fp32, bf16
// and fp16 storage, and GFLOP/s counted two ways: the tile products the kernel runs (every
// tile at or below the causal diagonal in full, 2 products forward and 5 backward) and the
// causal products' useful half (T (T + 1) / 2 query-key pairs).
//   flash_bench [B=4] [T=256] [heads=32] [kv_heads=4] [head_dim=64] [repeats=10] [types=fp32,bf16,fp16]
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <random>
#include <string>
#include <vector>

#include "core/half.hpp"
#include "kernels/cpu/flash_attention.hpp"

using Clock = std::chrono::steady_clock;
using namespace memfit;

namespace {

// On a shared host the wall clock counts the time other processes held the cores; with
// FLASH_BENCH_CPU_TIME=1 the process's CPU time is timed instead (meaningful with one thread).
double now_ms() {
  static const bool cpu_time = [] {
    const char* v = std::getenv("FLASH_BENCH_CPU_TIME");
    return v && *v == '1';
  }();
  if (!cpu_time) return std::chrono::duration<double, std::milli>(Clock::now().time_since_epoch()).count();
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return double(ts.tv_sec) * 1e3 + double(ts.tv_nsec) * 1e-6;
}

template <class F>
double best_ms(int repeats, F&& f) {
  double best = 1e30;
  for (int r = 0; r < repeats; ++r) {
    const double t0 = now_ms();
    f();
    best = std::min(best, now_ms() - t0);
  }
  return best;
}

template <class T>
std::vector<T> random_values(size_t n, uint32_t seed, float lo, float hi) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<T> out(n);
  for (auto& x : out) x = narrow<T>(dist(rng));
  return out;
}

template <class T>
void run(const char* name, const AttentionShape& s, int repeats) {
  const int threads = omp_get_max_threads();
  const int64_t N = s.batch * s.seq;
  const auto qkv = random_values<T>(size_t(N * s.qkv_channels()), 1, -2, 2);
  const auto dy = random_values<T>(size_t(N * s.channels()), 2, -1, 1);
  std::vector<T> y(size_t(N * s.channels())), dqkv(size_t(N * s.qkv_channels()));
  std::vector<float> lse(size_t(s.batch * s.heads * s.seq));
  std::vector<float> fwd_scratch(flash_forward_scratch_bytes(s, threads) / 4);
  std::vector<float> bwd_scratch(flash_backward_scratch_bytes(s, threads) / 4);
  const double fwd = best_ms(repeats, [&] {
    flash_attention_forward(s, qkv.data(), y.data(), lse.data(), fwd_scratch.data(), threads);
  });
  const double bwd = best_ms(repeats, [&] {
    flash_attention_backward(s, dy.data(), qkv.data(), y.data(), lse.data(), dqkv.data(), false, bwd_scratch.data(),
                             threads);
  });
  const double blocks = double((s.seq + kFlashBlock - 1) / kFlashBlock);
  const double tile_flops = 2.0 * double(kFlashBlock * kFlashBlock * s.head_dim) * blocks * (blocks + 1) / 2;
  const double useful_flops = 2.0 * double(s.head_dim) * double(s.seq) * double(s.seq + 1) / 2;
  const double heads = double(s.batch * s.heads);
  std::printf("%-5s forward %7.2f ms (%5.1f GFLOP/s tiles, %5.1f useful)   backward %7.2f ms (%5.1f tiles, %5.1f"
              " useful)\n",
              name, fwd, 2 * heads * tile_flops / fwd * 1e-6, 2 * heads * useful_flops / fwd * 1e-6, bwd,
              5 * heads * tile_flops / bwd * 1e-6, 5 * heads * useful_flops / bwd * 1e-6);
}

}  // namespace

int main(int argc, char** argv) {
  auto arg = [&](int i, int64_t fallback) { return argc > i ? std::atoll(argv[i]) : fallback; };
  AttentionShape s;
  s.batch = arg(1, 4), s.seq = arg(2, 256), s.heads = arg(3, 32), s.kv_heads = arg(4, 4), s.head_dim = arg(5, 64);
  s.scale = 1.0f / std::sqrt(float(s.head_dim));
  const int repeats = int(arg(6, 10));
  std::printf("flash attention: B=%ld T=%ld heads=%ld kv_heads=%ld head_dim=%ld, %d threads\n", long(s.batch),
              long(s.seq), long(s.heads), long(s.kv_heads), long(s.head_dim), omp_get_max_threads());
  const std::string types = argc > 7 ? argv[7] : "fp32,bf16,fp16";
  if (types.find("fp32") != std::string::npos) run<float>("fp32", s, repeats);
  if (types.find("bf16") != std::string::npos) run<bf16_t>("bf16", s, repeats);
  if (types.find("fp16") != std::string::npos) run<fp16_t>("fp16", s, repeats);
}
