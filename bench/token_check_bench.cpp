// What checking every token costs: the batch loader range-checks each token it hands out
// (train/data_loader.cpp), and TokenData::check_tokens_below scans a whole split before step 1.
// Times the loader's next() on GPT-2's bench shape (4 x 256 tokens, vocabulary 50257) against a
// floor that only copies the same number of tokens without any check, and the split scan per
// token; prints both next to the step time given on the command line (ms), so the share of a
// step is explicit.   token_check_bench [step_ms]
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "io/token_file.hpp"
#include "train/data_loader.hpp"

using Clock = std::chrono::steady_clock;

int main(int argc, char** argv) {
  const double step_ms = argc > 1 ? std::atof(argv[1]) : 3800.0;
  const int64_t n = int64_t(1) << 24, B = 4, T = 256, vocab = 50257, rounds = 20000;
  std::vector<uint16_t> tokens(static_cast<size_t>(n));
  std::mt19937 rng(1);
  for (auto& t : tokens) t = uint16_t(rng() % vocab);
  const std::vector<uint16_t> copy_source = tokens;
  const memfit::TokenData data = memfit::TokenData::from_tokens(std::move(tokens), "random tokens");
  memfit::BatchLoader loader(data, 0, n, B, T, vocab, true, 7, "bench");
  std::vector<int32_t> x(static_cast<size_t>(B * T)), y(static_cast<size_t>(B * T));

  auto t0 = Clock::now();
  for (int64_t r = 0; r < rounds; ++r) loader.next(x.data(), y.data());
  const double loader_ns = std::chrono::duration<double, std::nano>(Clock::now() - t0).count() / double(rounds);

  // The floor: the same tokens widened into the same buffers, rows from scattered offsets.
  int64_t sink = 0;
  t0 = Clock::now();
  for (int64_t r = 0; r < rounds; ++r) {
    const int64_t base = (r * 7919 * B * T) % (n - B * T - 1);
    for (int64_t i = 0; i < B * T; ++i) {
      x[size_t(i)] = copy_source[size_t(base + i)];
      y[size_t(i)] = copy_source[size_t(base + i + 1)];
    }
    sink += x[size_t(r % (B * T))];
  }
  const double floor_ns = std::chrono::duration<double, std::nano>(Clock::now() - t0).count() / double(rounds);

  t0 = Clock::now();
  data.check_tokens_below(0, n, vocab);
  const double scan_ns = std::chrono::duration<double, std::nano>(Clock::now() - t0).count() / double(n);

  std::printf("loader next() (checked), %lld x %lld tokens: %.1f us; unchecked copy floor: %.1f us; "
              "difference %.1f us = %.2e of a %.0f ms step\n",
              (long long)B, (long long)T, loader_ns / 1e3, floor_ns / 1e3, (loader_ns - floor_ns) / 1e3,
              (loader_ns - floor_ns) / (step_ms * 1e6), step_ms);
  std::printf("whole-split scan (check_tokens_below): %.3f ns per token, %.1f ms per 10^8 tokens (sink %lld)\n",
              scan_ns, scan_ns * 1e8 / 1e6, (long long)sink);
  return 0;
}
