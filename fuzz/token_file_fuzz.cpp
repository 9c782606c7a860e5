// libFuzzer target: TokenData::open in every format on arbitrary bytes (the first input byte
// picks the format, the rest is the file); an opened file must give every token in range.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <vector>

#include "core/error.hpp"
#include "fuzz_input_file.hpp"
#include "io/token_file.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  constexpr memfit::TokenFormat kFormats[] = {memfit::TokenFormat::automatic, memfit::TokenFormat::llmc,
                                              memfit::TokenFormat::nanogpt, memfit::TokenFormat::text};
  const memfit::TokenFormat format = kFormats[data[0] % 4];
  // .bin: auto-detection takes the nanoGPT and llm.c paths, not only text.
  const std::string& path = memfit::fuzz::write_input(data + 1, size - 1, ".bin");
  try {
    const memfit::TokenData tokens = memfit::TokenData::open(path, format);
    std::vector<int32_t> all(size_t(tokens.size()));
    tokens.copy(0, tokens.size(), all.data());
    // Negative values are uint32 tokens of Llama 3 files past INT32_MAX, as TokenData::at
    // documents; the batch loader and check_tokens_below refuse them by position.
    for (int32_t t : all)
      if (t >= tokens.vocab_hint()) std::abort();
    tokens.check_tokens_below(0, tokens.size(), tokens.vocab_hint());
  } catch (const memfit::Error&) {
  }
  return 0;
}
