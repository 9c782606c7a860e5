// The BPE model of an HF tokenizer.json ("model": {"type": "BPE"}): a vocabulary, merges by
// rank, and the options byte-level (GPT-2, Llama 3) and SentencePiece-style (Llama 2, Mistral)
// files use: byte_fallback to <0xNN> tokens, unk_token with fuse_unk, ignore_merges.
// Also the GPT-2 byte <-> unicode map that byte-level vocabularies are spelled in.
//
// Invariant: encode_word gives the ids `tokenizers` gives for the same pre-token (its
// Word::merge_all: lowest merge rank first, then leftmost), and every merge's result is in the
// vocabulary (load refuses a file where it is not).
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace memfit::text {

// Hash for string maps looked up by string_view without a copy.
struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
using TokenMap = std::unordered_map<std::string, uint32_t, StringHash, std::equal_to<>>;

class BpeModel {
 public:
  // model: the "model" object of tokenizer.json. Throws [text] for what it does not support
  // (dropout, continuing_subword_prefix, end_of_word_suffix), naming it.
  static BpeModel from_json(const nlohmann::json& model);

  // Words up to 256 bytes are remembered per thread (as `tokenizers` caches words): text repeats
  // its words, and merging is most of the time spent.
  void encode_word(std::string_view word, std::vector<uint32_t>& ids) const;
  std::optional<uint32_t> token_id(std::string_view token) const;
  bool has_byte_token(uint8_t byte) const { return byte_fallback_ && byte_tokens_[byte].has_value(); }
  // Whether an <unk> from before a line start can come out after it. Like `tokenizers`, a
  // pending <unk> is emitted at the next vocabulary symbol or unknown character, or at the
  // word's end: characters that fall back to <0xNN> bytes pass it by. So when unknowns can
  // occur and the newline is not a vocabulary symbol (it falls back to bytes, or is itself the
  // pending unknown), the <unk> crosses the line start in the whole text but not in a chunk
  // cut there, and with fuse_unk it also swallows the next line's leading unknowns.
  bool unk_may_cross_newline() const;
  const std::string* token_of(uint32_t id) const;  // nullptr when id is not in the vocabulary
  uint32_t max_id() const { return max_id_; }
  const TokenMap& vocab() const { return vocab_; }

 private:
  struct Merge {
    uint32_t rank;
    uint32_t result;
  };
  static uint64_t pair_key(uint32_t left, uint32_t right) { return (uint64_t(left) << 32) | right; }
  void merge_word(std::string_view word, std::vector<uint32_t>& ids) const;
  void initial_symbols(std::string_view word, std::vector<uint32_t>& symbols, std::vector<uint32_t>& lengths) const;

  TokenMap vocab_;
  std::vector<const std::string*> tokens_by_id_;
  std::unordered_map<uint64_t, Merge> merges_;
  std::array<std::optional<uint32_t>, 256> byte_tokens_{};  // <0xNN>, with byte_fallback
  std::optional<uint32_t> unk_id_;
  bool byte_fallback_ = false, fuse_unk_ = false, ignore_merges_ = false;
  uint32_t max_id_ = 0;
  uint64_t cache_key_ = 0;  // names this vocabulary and merges in the per-thread word cache
};

// GPT-2's bytes_to_unicode: each byte as the character byte-level vocabularies spell it in.
const std::array<std::string, 256>& byte_level_alphabet();
// The inverse, for a character of that alphabet; nullopt for any other character.
std::optional<uint8_t> byte_level_byte(uint32_t codepoint);
std::string to_byte_level(std::string_view bytes);

}  // namespace memfit::text
