#include "text/utf8.hpp"

namespace memfit::text {

namespace {

// Bytes of the valid sequence at s[i..] (1 to 4), or minus the length of its maximal invalid
// subpart (at least 1), following the Unicode "U+FFFD substitution of maximal subparts" practice.
int next_sequence(std::string_view s, size_t i) {
  const auto b = static_cast<unsigned char>(s[i]);
  if (b < 0x80) return 1;
  int length = 0;
  unsigned char low = 0x80, high = 0xBF;  // the range of the second byte
  if (b >= 0xC2 && b <= 0xDF) length = 2;
  else if (b == 0xE0) length = 3, low = 0xA0;
  else if (b >= 0xE1 && b <= 0xEC) length = 3;
  else if (b == 0xED) length = 3, high = 0x9F;  // no surrogates
  else if (b >= 0xEE && b <= 0xEF) length = 3;
  else if (b == 0xF0) length = 4, low = 0x90;
  else if (b >= 0xF1 && b <= 0xF3) length = 4;
  else if (b == 0xF4) length = 4, high = 0x8F;  // nothing past U+10FFFF
  else return -1;
  for (int j = 1; j < length; ++j) {
    if (i + j >= s.size()) return -j;
    const auto c = static_cast<unsigned char>(s[i + j]);
    const unsigned char lo = j == 1 ? low : 0x80, hi = j == 1 ? high : 0xBF;
    if (c < lo || c > hi) return -j;
  }
  return length;
}

}  // namespace

std::string to_valid_utf8(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  size_t i = 0;
  while (i < bytes.size()) {
    const int n = next_sequence(bytes, i);
    if (n > 0) {
      out.append(bytes.substr(i, size_t(n)));
      i += size_t(n);
    } else {
      out.append(kReplacementCharacter);
      i += size_t(-n);
    }
  }
  return out;
}

bool is_valid_utf8(std::string_view bytes) {
  for (size_t i = 0; i < bytes.size();) {
    const int n = next_sequence(bytes, i);
    if (n < 0) return false;
    i += size_t(n);
  }
  return true;
}

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += char(cp);
  } else if (cp < 0x800) {
    out += char(0xC0 | (cp >> 6));
    out += char(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += char(0xE0 | (cp >> 12));
    out += char(0x80 | ((cp >> 6) & 0x3F));
    out += char(0x80 | (cp & 0x3F));
  } else {
    out += char(0xF0 | (cp >> 18));
    out += char(0x80 | ((cp >> 12) & 0x3F));
    out += char(0x80 | ((cp >> 6) & 0x3F));
    out += char(0x80 | (cp & 0x3F));
  }
}

}  // namespace memfit::text
