// Tokenizer throughput, memfit's side of the pair with tools/tokenizer_peer_bench.py (the HF
// `tokenizers` library on the same file):
//   tokenizer_bench TOKENIZER(.json|DIR) FILE [repeats]
// 1. one thread, the whole file as one text (Tokenizer::encode): MB/s, best of `repeats` (3);
//    the peer's `encode` of the same text is its one-thread number.
// 2. all cores (OMP_NUM_THREADS), `memfit tokenize`'s streaming path (tokenize_files, 1 MiB
//    chunks cut at line starts, the file written to a temporary .bin): MB/s including the
//    read and the write; the peer's `encode_batch` over the same chunks is its all-cores number.
// Prints the token counts too: both sides must give the same count for the same file.
#include <omp.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "text/tokenize_files.hpp"
#include "text/tokenizer.hpp"

using Clock = std::chrono::steady_clock;

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: tokenizer_bench TOKENIZER FILE [repeats]\n");
    return 2;
  }
  const int repeats = argc > 3 ? std::atoi(argv[3]) : 3;
  try {
    const memfit::text::Tokenizer tokenizer = memfit::text::Tokenizer::load(argv[1]);
    std::ifstream in(argv[2], std::ios::binary);
    std::ostringstream buffer;
    buffer << in.rdbuf();
    const std::string text = buffer.str();
    const double mb = 1e-6 * double(text.size());

    double best = 1e30;
    size_t tokens = 0;
    for (int r = 0; r < repeats; ++r) {
      const auto t0 = Clock::now();
      tokens = tokenizer.encode(text).size();
      best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count());
    }
    std::printf("memfit one thread: %.2f MB/s (%.2f MB in %.3f s, %zu tokens)\n", mb / best, mb, best, tokens);

    const std::string out = (std::filesystem::temp_directory_path() / "memfit_tokenizer_bench.bin").string();
    memfit::text::TokenizeOptions options;
    options.inputs = {argv[2]};
    options.out = out;
    options.val_fraction = 0;
    best = 1e30;
    int64_t streamed = 0;
    for (int r = 0; r < repeats; ++r) {
      const auto t0 = Clock::now();
      streamed = memfit::text::tokenize_files(tokenizer, options).train_tokens;
      best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count());
    }
    std::filesystem::remove(out);
    std::printf("memfit %d threads (tokenize, 1 MiB chunks): %.2f MB/s (%.3f s, %lld tokens)\n",
                omp_get_max_threads(), mb / best, best, static_cast<long long>(streamed));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tokenizer_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
