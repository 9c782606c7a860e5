#include "text/pipeline.hpp"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <utf8proc.h>

#include <cstdlib>

#include <nlohmann/json.hpp>

#include "core/error.hpp"
#include "text/bpe.hpp"
#include "text/utf8.hpp"

namespace memfit::text {

namespace {

constexpr std::string_view kPiece = "text";

std::string type_of(const nlohmann::json& spec, std::string_view what) {
  MEMFIT_CHECK(spec.is_object() && spec.contains("type") && spec["type"].is_string(), kPiece,
               "tokenizer.json: {} has no \"type\": {}", what, spec.dump().substr(0, 200));
  return spec["type"].get<std::string>();
}

// The string of a {"String": s} pattern; a {"Regex": r} pattern is refused where only strings work.
std::string string_pattern(const nlohmann::json& pattern, std::string_view what) {
  MEMFIT_CHECK(pattern.is_object() && pattern.contains("String") && pattern["String"].is_string(), kPiece,
               "tokenizer.json: {} with pattern {} is not supported (only a plain string)", what, pattern.dump());
  const std::string s = pattern["String"].get<std::string>();
  MEMFIT_CHECK(!s.empty(), kPiece, "tokenizer.json: {} with an empty pattern", what);
  return s;
}

bool starts_with(std::string_view text, std::string_view prefix) { return text.substr(0, prefix.size()) == prefix; }

}  // namespace

void replace_all(std::string& text, std::string_view pattern, std::string_view content) {
  if (text.find(pattern) == std::string::npos) return;
  std::string out;
  out.reserve(text.size());
  size_t start = 0;
  for (size_t at; (at = text.find(pattern, start)) != std::string::npos; start = at + pattern.size()) {
    out.append(text, start, at - start);
    out.append(content);
  }
  out.append(text, start, std::string::npos);
  text = std::move(out);
}

// ---- Regex --------------------------------------------------------------------------------

Regex::Regex(const std::string& pattern) {
  int error = 0;
  PCRE2_SIZE offset = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                   PCRE2_UTF | PCRE2_UCP, &error, &offset, nullptr);
  if (code == nullptr) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error, message, sizeof(message));
    throw Error(kPiece, fmt::format("tokenizer.json: regex '{}' does not compile at offset {}: {}", pattern, offset,
                                    reinterpret_cast<const char*>(message)));
  }
  // The JIT is a speed-up only: the interpreter gives the same matches where it is unavailable.
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
  code_ = std::shared_ptr<void>(code, [](void* p) { pcre2_code_free(static_cast<pcre2_code*>(p)); });
}

bool Regex::next_match(std::string_view text, size_t start, size_t& begin, size_t& end) const {
  auto* code = static_cast<pcre2_code*>(code_.get());
  thread_local std::unique_ptr<pcre2_match_data, decltype(&pcre2_match_data_free)> data(
      pcre2_match_data_create(8, nullptr), &pcre2_match_data_free);
  while (start < text.size()) {
    const int rc = pcre2_match(code, reinterpret_cast<PCRE2_SPTR>(text.data()), text.size(), start,
                               PCRE2_NO_UTF_CHECK, data.get(), nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) return false;
    MEMFIT_CHECK(rc >= 0, kPiece, "pre-tokenizer regex failed with PCRE2 error {} on a {}-byte text", rc,
                 text.size());
    const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(data.get());
    begin = ovector[0];
    end = ovector[1];
    if (end > begin) return true;
    start = begin + utf8_char_length(static_cast<unsigned char>(text[begin]));  // skip an empty match
  }
  return false;
}

// ---- Normalizer ---------------------------------------------------------------------------

void Normalizer::add(const nlohmann::json& spec, std::vector<Step>& steps) {
  const std::string type = type_of(spec, "normalizer");
  Step step;
  if (type == "Sequence") {
    for (const auto& inner : spec.at("normalizers")) add(inner, steps);
    return;
  }
  if (type == "Prepend") {
    step.kind = Kind::prepend;
    step.pattern = spec.at("prepend").get<std::string>();
  } else if (type == "Replace") {
    step.kind = Kind::replace;
    step.pattern = string_pattern(spec.at("pattern"), "normalizer Replace");
    step.content = spec.at("content").get<std::string>();
  } else if (type == "NFC" || type == "NFD" || type == "NFKC" || type == "NFKD") {
    step.kind = Kind::unicode;
    const bool compose = type.back() == 'C', compatibility = type.size() == 4;
    step.unicode_options = UTF8PROC_STABLE | (compose ? UTF8PROC_COMPOSE : UTF8PROC_DECOMPOSE) |
                           (compatibility ? UTF8PROC_COMPAT : 0);
  } else {
    throw Error(kPiece, fmt::format("tokenizer.json: normalizer type '{}' is not supported (memfit reads "
                                    "Sequence, Prepend, Replace, NFC, NFD, NFKC and NFKD)",
                                    type));
  }
  steps.push_back(step);
}

namespace {

std::string unicode_normal_form(const std::string& text, int options) {
  utf8proc_uint8_t* mapped = nullptr;
  const utf8proc_ssize_t n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(text.data()),
                                          utf8proc_ssize_t(text.size()), &mapped, utf8proc_option_t(options));
  MEMFIT_CHECK(n >= 0, kPiece, "Unicode normalization failed: {}", utf8proc_errmsg(n));  // input is valid UTF-8
  std::string out(reinterpret_cast<const char*>(mapped), size_t(n));
  std::free(mapped);
  return out;
}

}  // namespace

Normalizer Normalizer::from_json(const nlohmann::json& spec) {
  Normalizer n;
  if (!spec.is_null()) add(spec, n.steps_);
  return n;
}

void Normalizer::apply(std::string& text, bool prepend_allowed) const {
  for (const Step& step : steps_) {
    if (step.kind == Kind::prepend) {
      if (prepend_allowed && !text.empty()) text = step.pattern + text;
    } else if (step.kind == Kind::replace) {
      replace_all(text, step.pattern, step.content);
    } else {
      text = unicode_normal_form(text, step.unicode_options);
    }
  }
}

// ---- PreTokenizer -------------------------------------------------------------------------

namespace {

// GPT-2's split, which the ByteLevel pre-tokenizer applies with use_regex.
constexpr const char* kGpt2Pattern = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

std::shared_ptr<const Regex> split_regex(const nlohmann::json& pattern) {
  if (pattern.is_object() && pattern.contains("Regex") && pattern["Regex"].is_string())
    return std::make_shared<Regex>(pattern["Regex"].get<std::string>());
  const std::string literal = string_pattern(pattern, "pre_tokenizer Split");
  MEMFIT_CHECK(literal.find("\\E") == std::string::npos, kPiece,
               "tokenizer.json: pre_tokenizer Split on the string '{}' is not supported", literal);
  return std::make_shared<Regex>("\\Q" + literal + "\\E");
}

void split_isolated(const Regex& regex, Piece& piece, std::vector<Piece>& out) {
  bool first = true;
  auto emit = [&](size_t begin, size_t end) {
    out.push_back({piece.text.substr(begin, end - begin), first && piece.starts_text, first && piece.continues});
    first = false;
  };
  size_t last = 0;
  regex.for_each_match(piece.text, [&](size_t begin, size_t end) {
    if (begin > last) emit(last, begin);
    emit(begin, end);
    last = end;
  });
  if (last < piece.text.size()) emit(last, piece.text.size());
}

}  // namespace

void PreTokenizer::add(const nlohmann::json& spec, std::vector<Step>& steps) {
  const std::string type = type_of(spec, "pre_tokenizer");
  if (type == "Sequence") {
    for (const auto& inner : spec.at("pretokenizers")) add(inner, steps);
  } else if (type == "ByteLevel") {
    Step step;
    step.kind = Kind::byte_level;
    step.add_prefix_space = spec.value("add_prefix_space", true);
    if (spec.value("use_regex", true)) step.regex = std::make_shared<Regex>(kGpt2Pattern);
    steps.push_back(step);
  } else if (type == "Split") {
    const std::string behavior = spec.value("behavior", "");
    MEMFIT_CHECK(behavior == "Isolated", kPiece,
                 "tokenizer.json: pre_tokenizer Split with behavior '{}' is not supported (only Isolated)", behavior);
    MEMFIT_CHECK(!spec.value("invert", false), kPiece,
                 "tokenizer.json: pre_tokenizer Split with invert is not supported");
    Step step;
    step.kind = Kind::split;
    step.regex = split_regex(spec.at("pattern"));
    steps.push_back(step);
  } else if (type == "Metaspace") {
    Step step;
    step.kind = Kind::metaspace;
    step.replacement = spec.at("replacement").get<std::string>();
    const std::string scheme = spec.value("prepend_scheme", "always");
    MEMFIT_CHECK(scheme == "always" || scheme == "first" || scheme == "never", kPiece,
                 "tokenizer.json: Metaspace prepend_scheme '{}' is not supported", scheme);
    step.prepend = scheme == "always" ? Prepend::always : scheme == "first" ? Prepend::first : Prepend::never;
    if (spec.contains("add_prefix_space") && spec["add_prefix_space"] == false) step.prepend = Prepend::never;
    step.split = spec.value("split", true);
    steps.push_back(step);
  } else {
    throw Error(kPiece, fmt::format("tokenizer.json: pre_tokenizer type '{}' is not supported (memfit reads "
                                    "ByteLevel, Split, Metaspace and Sequence)",
                                    type));
  }
}

PreTokenizer PreTokenizer::from_json(const nlohmann::json& spec) {
  PreTokenizer p;
  if (!spec.is_null()) add(spec, p.steps_);
  return p;
}

bool PreTokenizer::prefixes_every_split_piece() const {
  bool after_split = false;
  for (const Step& s : steps_) {
    const bool prefixes = (s.kind == Kind::byte_level && s.add_prefix_space) ||
                          (s.kind == Kind::metaspace && s.prepend == Prepend::always);
    if (after_split && prefixes) return true;
    after_split = after_split || s.kind == Kind::split || (s.kind == Kind::byte_level && s.regex);
  }
  return false;
}

void PreTokenizer::apply(std::vector<Piece>& pieces) const {
  for (const Step& step : steps_) apply_step(step, pieces);
}

void PreTokenizer::apply_step(const Step& step, std::vector<Piece>& pieces) {
  std::vector<Piece> out;
  out.reserve(pieces.size());
  for (Piece& piece : pieces) {
    if (step.kind == Kind::split) {
      split_isolated(*step.regex, piece, out);
    } else if (step.kind == Kind::byte_level) {
      // (not insert(0, ...): it trips a GCC 12 -Wrestrict false positive)
      if (step.add_prefix_space && !piece.continues && !starts_with(piece.text, " ")) piece.text = " " + piece.text;
      const size_t first = out.size();
      if (step.regex) split_isolated(*step.regex, piece, out);
      else out.push_back(std::move(piece));
      for (size_t i = first; i < out.size(); ++i) out[i].text = to_byte_level(out[i].text);
    } else {
      replace_all(piece.text, " ", step.replacement);
      const bool marked = starts_with(piece.text, step.replacement);
      if (!marked && ((step.prepend == Prepend::always && !piece.continues) ||
                      (step.prepend == Prepend::first && piece.starts_text)))
        piece.text = step.replacement + piece.text;
      if (!step.split) {
        out.push_back(std::move(piece));
        continue;
      }
      size_t begin = 0;  // MergedWithNext: each replacement opens a new pre-token
      for (size_t at = piece.text.find(step.replacement, 1); at != std::string::npos;
           at = piece.text.find(step.replacement, at + 1)) {
        out.push_back({piece.text.substr(begin, at - begin), begin == 0 && piece.starts_text,
                       begin == 0 && piece.continues});
        begin = at;
      }
      if (begin < piece.text.size())
        out.push_back({piece.text.substr(begin), begin == 0 && piece.starts_text, begin == 0 && piece.continues});
    }
  }
  pieces = std::move(out);
}

// ---- Decoder ------------------------------------------------------------------------------

void Decoder::add(const nlohmann::json& spec, std::vector<Step>& steps) {
  const std::string type = type_of(spec, "decoder");
  if (type == "Sequence") {
    for (const auto& inner : spec.at("decoders")) add(inner, steps);
  } else if (type == "ByteLevel") {
    steps.push_back(decoder_step(Kind::byte_level));
  } else if (type == "Replace") {
    steps.push_back(decoder_step(Kind::replace, string_pattern(spec.at("pattern"), "decoder Replace"),
                                 spec.at("content").get<std::string>()));
  } else if (type == "ByteFallback") {
    steps.push_back(decoder_step(Kind::byte_fallback));
  } else if (type == "Fuse") {
    steps.push_back(decoder_step(Kind::fuse));
  } else if (type == "Strip") {
    Step step = decoder_step(Kind::strip, "", spec.at("content").get<std::string>());
    step.start = spec.value("start", size_t(0));
    step.stop = spec.value("stop", size_t(0));
    steps.push_back(step);
  } else if (type == "Metaspace") {
    Step step = decoder_step(Kind::metaspace, "", spec.at("replacement").get<std::string>());
    step.prepend = spec.value("prepend_scheme", "always") != "never";
    if (spec.contains("add_prefix_space") && spec["add_prefix_space"] == false) step.prepend = false;
    steps.push_back(step);
  } else {
    throw Error(kPiece, fmt::format("tokenizer.json: decoder type '{}' is not supported (memfit reads ByteLevel, "
                                    "Replace, ByteFallback, Fuse, Strip, Metaspace and Sequence)",
                                    type));
  }
}

Decoder Decoder::from_json(const nlohmann::json& spec) {
  Decoder d;
  d.present_ = !spec.is_null();
  if (d.present_) add(spec, d.steps_);
  return d;
}

std::string Decoder::decode(std::vector<std::string> tokens) const {
  if (!present_) {
    std::string joined;
    for (size_t i = 0; i < tokens.size(); ++i) joined += (i ? " " : "") + tokens[i];
    return joined;
  }
  for (const Step& step : steps_) apply_step(step, tokens);
  std::string out;
  for (const auto& t : tokens) out += t;
  return out;
}

namespace {

std::string byte_level_decode(const std::vector<std::string>& tokens) {
  std::string bytes;
  for (const std::string& token : tokens) {
    std::string mapped;
    bool all = true;
    for (size_t i = 0; i < token.size() && all;) {
      const size_t n = utf8_char_length(static_cast<unsigned char>(token[i]));
      uint32_t cp = n == 1 ? uint32_t(static_cast<unsigned char>(token[i])) : 0;
      if (n > 1) {
        cp = static_cast<unsigned char>(token[i]) & (0xFF >> (n + 1));
        for (size_t j = 1; j < n; ++j) cp = (cp << 6) | (static_cast<unsigned char>(token[i + j]) & 0x3F);
      }
      const auto byte = byte_level_byte(cp);
      all = byte.has_value();
      if (all) mapped += char(*byte);
      i += n;
    }
    bytes += all ? mapped : token;  // a token outside the alphabet (an added token) stays as written
  }
  return to_valid_utf8(bytes);
}

std::optional<uint8_t> fallback_byte(const std::string& token) {
  if (token.size() != 6 || !starts_with(token, "<0x") || token[5] != '>') return std::nullopt;
  uint8_t value = 0;
  for (size_t i = 3; i < 5; ++i) {
    const char c = token[i];
    const int digit = c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'F' ? c - 'A' + 10
                      : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
    if (digit < 0) return std::nullopt;
    value = uint8_t(value * 16 + digit);
  }
  return value;
}

void byte_fallback_decode(std::vector<std::string>& tokens) {
  std::vector<std::string> out;
  std::string pending;
  auto flush = [&] {
    if (pending.empty()) return;
    if (is_valid_utf8(pending)) out.push_back(pending);
    else
      for (size_t i = 0; i < pending.size(); ++i) out.emplace_back(kReplacementCharacter);
    pending.clear();
  };
  for (std::string& token : tokens) {
    if (const auto byte = fallback_byte(token)) {
      pending += char(*byte);
      continue;
    }
    flush();
    out.push_back(std::move(token));
  }
  flush();
  tokens = std::move(out);
}

void strip_decode(std::vector<std::string>& tokens, const std::string& content, size_t start, size_t stop) {
  for (std::string& token : tokens) {
    for (size_t i = 0; i < start && starts_with(token, content); ++i) token.erase(0, content.size());
    for (size_t i = 0; i < stop && token.size() >= content.size() &&
                       token.compare(token.size() - content.size(), content.size(), content) == 0;
         ++i)
      token.resize(token.size() - content.size());
  }
}

}  // namespace

void Decoder::apply_step(const Step& step, std::vector<std::string>& tokens) {
  switch (step.kind) {
    case Kind::byte_level: tokens = {byte_level_decode(tokens)}; break;
    case Kind::replace:
      for (auto& t : tokens) replace_all(t, step.pattern, step.content);
      break;
    case Kind::byte_fallback: byte_fallback_decode(tokens); break;
    case Kind::fuse: {
      std::string fused;
      for (const auto& t : tokens) fused += t;
      tokens = {fused};
      break;
    }
    case Kind::strip: strip_decode(tokens, step.content, step.start, step.stop); break;
    case Kind::metaspace:
      for (size_t i = 0; i < tokens.size(); ++i)
        replace_all(tokens[i], step.content, i == 0 && step.prepend ? "" : " ");
      break;
  }
}

}  // namespace memfit::text
