// The steps of an HF tokenizer.json around its model, as `tokenizers` runs them:
//   normalizer     (Sequence, Prepend, Replace of a string, NFC, NFD, NFKC, NFKD through
//                  utf8proc)   on each text between added tokens
//   pre_tokenizer  (Sequence, ByteLevel, Split on a regex or string, Metaspace)  into pre-tokens
//   decoder        (Sequence, ByteLevel, Replace, ByteFallback, Fuse, Strip, Metaspace)
// Regexes are PCRE2 with UTF and Unicode properties (\p{L}, \p{N}, \s), JIT-compiled.
// Any other type, or an option these steps do not implement, is refused in one [text] line that
// names it; nothing is skipped silently.
//
// Invariant: a Piece's flags say where it sits in the whole text, so a text encoded in chunks
// split at line starts gives the ids of the whole: `starts_text` (it begins at offset 0 of the
// text: Metaspace's prepend_scheme "first") and `continues` (it continues a piece of the
// previous chunk: no Prepend, no prefix space).
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace memfit::text {

struct Piece {
  std::string text;
  bool starts_text = false;
  bool continues = false;
};

class Regex {
 public:
  explicit Regex(const std::string& pattern);  // throws [text] with PCRE2's message
  // Calls on_match(begin, end) for each non-overlapping non-empty match, left to right.
  template <class OnMatch>
  void for_each_match(std::string_view text, OnMatch&& on_match) const {
    size_t start = 0, begin = 0, end = 0;
    while (next_match(text, start, begin, end)) {
      on_match(begin, end);
      start = end;
    }
  }

 private:
  bool next_match(std::string_view text, size_t start, size_t& begin, size_t& end) const;
  std::shared_ptr<void> code_;
};

class Normalizer {
 public:
  static Normalizer from_json(const nlohmann::json& spec);  // null: no normalizer
  // prepend_allowed: false for a piece that continues the previous chunk.
  void apply(std::string& text, bool prepend_allowed) const;
  bool empty() const { return steps_.empty(); }

 private:
  enum class Kind { prepend, replace, unicode };
  struct Step {
    Kind kind = Kind::prepend;
    std::string pattern, content;  // prepend: pattern; replace: pattern -> content
    int unicode_options = 0;       // unicode: utf8proc's options for the normal form
  };
  static void add(const nlohmann::json& spec, std::vector<Step>& steps);
  std::vector<Step> steps_;
};

class PreTokenizer {
 public:
  static PreTokenizer from_json(const nlohmann::json& spec);  // null: the text is one pre-token
  void apply(std::vector<Piece>& pieces) const;
  // A step after a split that puts a prefix (ByteLevel's space, Metaspace's "always" mark) on
  // every piece: a piece starting a line then gets one in the whole text, but not as the
  // continuing first piece of a chunk cut at that line start (tokenizer_fuzz found it).
  bool prefixes_every_split_piece() const;

 private:
  enum class Kind { byte_level, split, metaspace };
  enum class Prepend { always, first, never };
  struct Step {
    Kind kind = Kind::byte_level;
    std::shared_ptr<const Regex> regex;  // byte_level with use_regex, split
    bool add_prefix_space = false;
    std::string replacement;  // metaspace
    Prepend prepend = Prepend::always;
    bool split = true;
  };
  static void add(const nlohmann::json& spec, std::vector<Step>& steps);
  static void apply_step(const Step& step, std::vector<Piece>& pieces);
  std::vector<Step> steps_;
};

class Decoder {
 public:
  static Decoder from_json(const nlohmann::json& spec);  // null: tokens joined by spaces, as tokenizers does
  std::string decode(std::vector<std::string> tokens) const;

 private:
  enum class Kind { byte_level, replace, byte_fallback, fuse, strip, metaspace };
  struct Step {
    Kind kind = Kind::byte_level;
    std::string pattern, content;  // replace; strip: content; metaspace: the replacement
    size_t start = 0, stop = 0;    // strip
    bool prepend = true;           // metaspace: prepend_scheme is not "never"
  };
  static Step decoder_step(Kind kind, std::string pattern = "", std::string content = "") {
    Step step;
    step.kind = kind;
    step.pattern = std::move(pattern);
    step.content = std::move(content);
    return step;
  }
  static void add(const nlohmann::json& spec, std::vector<Step>& steps);
  static void apply_step(const Step& step, std::vector<std::string>& tokens);
  std::vector<Step> steps_;
  bool present_ = false;
};

// Replaces every occurrence of pattern (non-empty) in text.
void replace_all(std::string& text, std::string_view pattern, std::string_view content);

}  // namespace memfit::text
