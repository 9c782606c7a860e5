// libFuzzer target: an HF tokenizer.json from arbitrary bytes. It is either refused with a
// memfit::Error, or it loads, and then encoding any text (fixed samples with special tokens,
// invalid UTF-8 and line starts, and the input's own bytes) gives ids that decode without an
// error (decode throws for an id outside the vocabulary: a bug, so it is not caught), and
// encoding chunk by chunk at line starts gives the whole text's ids whenever
// splits_at_line_starts() says it may (what `memfit tokenize` relies on). The inputs in
// fuzz/regressions/tokenizer/ broke that once: fused unknowns across a byte-fallback newline.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string_view>
#include <vector>

#include "core/error.hpp"
#include "text/tokenizer.hpp"

namespace {

void check_text(const memfit::text::Tokenizer& t, std::string_view text) {
  const std::vector<uint32_t> ids = t.encode(text);
  (void)t.decode(ids);
  if (!t.splits_at_line_starts()) return;
  std::vector<uint32_t> chunked;
  size_t begin = 0;
  for (size_t p = 1; p <= text.size(); ++p) {
    if (p < text.size() && !memfit::text::Tokenizer::is_line_start(text, p)) continue;
    t.encode_into(text.substr(begin, p - begin), begin == 0, chunked);
    begin = p;
  }
  if (chunked != ids) {
    std::fprintf(stderr, "chunk-wise ids differ from the whole text's (%zu bytes)\n", text.size());
    std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view json(reinterpret_cast<const char*>(data), size);
  std::optional<memfit::text::Tokenizer> t;
  try {
    t.emplace(memfit::text::Tokenizer::from_json_text(json, "fuzz input"));
  } catch (const memfit::Error&) {
    return 0;
  }
  static const char* const kSamples[] = {
      "Hello world, it's 2026!\n  indented\tline\r\nend",
      "<|endoftext|>special <|user|> tokens\n\n",
      "caf\xc3\xa9 \xe2\x96\x81 \xff\xfe invalid \xc3 utf-8 \xf0\x9f\x98\x80\n\xc3\n\xe2\x96",
      "",
  };
  for (const char* s : kSamples) check_text(*t, s);
  check_text(*t, json.substr(0, 256));
  return 0;
}
