// A tokenizer read from an HF tokenizer.json: byte-level BPE (GPT-2, Llama 3, Qwen2 without a
// normalizer) and SentencePiece-style BPE with byte fallback (Llama 2, Mistral). Encoding runs
// as `tokenizers`' encode(text, add_special_tokens=False): added and special tokens are matched
// first (leftmost-longest; tokens with "normalized": false on the raw text, the others on the
// normalized text), then the normalizer, the pre-tokenizer and the BPE model run on the text
// between them. Decoding is decode(ids, skip_special_tokens=False).
// The post-processor (BOS/EOS templates), truncation and padding shape model inputs, not the
// text -> ids map, and are not applied.
//
// Invariant: encode gives `tokenizers`' ids for any bytes (invalid UTF-8 is read as U+FFFD, as
// Python's and Rust's lossy decoders do), and for a text cut at line starts (is_line_start) and
// encoded chunk by chunk, the concatenated ids equal those of the whole text whenever
// splits_at_line_starts() (checked at load: no token spans a line start). A Tokenizer is
// immutable after load, so threads may encode with one Tokenizer concurrently.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "text/bpe.hpp"
#include "text/pipeline.hpp"

namespace memfit::text {

struct AddedToken {
  std::string content;
  uint32_t id = 0;
  bool special = false;
  bool normalized = false;
};

class Tokenizer {
 public:
  // path: a tokenizer.json, or a directory holding one. Throws [text] in one line naming the
  // file and what is wrong (corrupt json, unknown model type, unsupported step).
  static Tokenizer load(const std::string& path);
  static Tokenizer from_json_text(std::string_view json, const std::string& description);

  // at_text_start: false when text continues a text cut at a line start before it.
  std::vector<uint32_t> encode(std::string_view text, bool at_text_start = true) const;
  void encode_into(std::string_view text, bool at_text_start, std::vector<uint32_t>& ids) const;
  std::string decode(std::span<const uint32_t> ids) const;  // throws [text] for an id outside the vocabulary

  uint32_t vocab_size() const { return vocab_size_; }  // the largest id + 1
  std::optional<uint32_t> token_id(std::string_view token) const;  // added tokens first, then the model
  const std::vector<AddedToken>& added_tokens() const { return added_; }
  bool splits_at_line_starts() const { return splits_at_line_starts_; }
  const std::string& description() const { return description_; }

  // A chunk may start at p when the byte before is '\n' and the character at p is printable
  // ASCII other than space, or a letter or number (\p{L}, \p{N}: CJK lines too): never
  // whitespace, so every supported pre-tokenizer ends a pre-token there.
  static bool is_line_start(std::string_view text, size_t p) {
    if (p == 0 || p >= text.size() || text[p - 1] != '\n') return false;
    const auto c = static_cast<unsigned char>(text[p]);
    return (c > ' ' && c < 0x7F) || (c >= 0xC2 && starts_with_letter_or_number(text.substr(p)));
  }
  static bool starts_with_letter_or_number(std::string_view text);  // a valid UTF-8 \p{L} or \p{N} first

 private:
  struct Segment {
    std::string_view text;
    std::optional<uint32_t> added;  // the id, when the segment is an added token
    size_t offset;
  };
  void split_on_added(std::string_view text, bool normalized, size_t base, std::vector<Segment>& out) const;
  void encode_segment(const Segment& segment, bool at_text_start, std::vector<uint32_t>& ids) const;
  bool check_line_start_splits() const;

  std::string description_;
  BpeModel model_{};
  Normalizer normalizer_;
  PreTokenizer pre_tokenizer_;
  Decoder decoder_;
  std::vector<AddedToken> added_;
  std::vector<std::vector<size_t>> added_by_first_byte_[2];  // [normalized] -> byte -> indices, longest first
  std::vector<const AddedToken*> added_by_id_;
  uint32_t vocab_size_ = 0;
  bool splits_at_line_starts_ = false;
};

}  // namespace memfit::text
