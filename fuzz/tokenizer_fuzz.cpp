// libFuzzer target: an HF tokenizer.json from arbitrary bytes. It is either refused with a
// memfit::Error, or it loads, and then encoding any text (fixed samples with special tokens,
// invalid UTF-8 and line starts, and the input's own bytes) gives ids that decode without an
// error (decode throws for an id outside the vocabulary: a bug, so it is not caught).
// Not checked here: that encoding chunk by chunk at line starts equals the whole text's when
// splits_at_line_starts() says so; the first minutes of fuzzing found tokenizers with
// fuse_unk and a partial byte-fallback table where it does not (issue 21's notes).
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

#include "core/error.hpp"
#include "text/tokenizer.hpp"

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
      "caf\xc3\xa9 \xe2\x96\x81 \xff\xfe invalid \xc3 utf-8 \xf0\x9f\x98\x80",
      "",
  };
  for (const char* s : kSamples) (void)t->decode(t->encode(s));
  (void)t->decode(t->encode(json.substr(0, 256)));
  return 0;
}
