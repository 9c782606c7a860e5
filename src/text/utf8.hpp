// UTF-8 helpers for the tokenizer: the lossy decoding `tokenizers` users get (Python's
// bytes.decode(errors="replace") and Rust's String::from_utf8_lossy agree: each maximal invalid
// subpart becomes one U+FFFD), and walking a valid UTF-8 string character by character.
//
// Invariant: to_valid_utf8 returns valid UTF-8 and leaves valid input unchanged; utf8_char_length
// is only called on valid UTF-8.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace memfit::text {

inline constexpr std::string_view kReplacementCharacter = "\xEF\xBF\xBD";  // U+FFFD

// Valid UTF-8, with every maximal invalid subpart of bytes replaced by U+FFFD.
std::string to_valid_utf8(std::string_view bytes);
bool is_valid_utf8(std::string_view bytes);

// Length in bytes of the character that starts with lead (valid UTF-8).
inline size_t utf8_char_length(unsigned char lead) {
  return lead < 0x80 ? 1 : lead < 0xE0 ? 2 : lead < 0xF0 ? 3 : 4;
}

void append_utf8(std::string& out, uint32_t codepoint);

}  // namespace memfit::text
