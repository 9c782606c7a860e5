// Token sequences for training and evaluation: llm.c .bin files (a 1024-byte header, then
// uint16 tokens, or uint32 tokens in Llama 3 files), nanoGPT .bin files (raw uint16 tokens) and
// plain text (one token per byte).
//
// Invariant: a TokenData holds at least 2 tokens (one input/target pair), and every token it
// returns is below vocab_hint() (a uint32 token of a Llama 3 file past INT32_MAX comes back
// negative; the batch loader and check_tokens_below refuse it). Auto-detection is strict: an llm.c header with a damaged
// magic is refused, never read as nanoGPT tokens, and llm.c's reserved header fields are zero. Files are mapped read-only and never copied; the mapping
// lives in a move-only handle, so a TokenData can be moved but not copied.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "io/mapped_file.hpp"

namespace memfit {

enum class TokenFormat { automatic, llmc, nanogpt, text };

TokenFormat parse_token_format(std::string_view name);  // "auto", "llmc", "nanogpt", "text"; throws [data]
std::string_view token_format_name(TokenFormat format);

class TokenData {
 public:
  // automatic: llm.c when the file starts with the llm.c magic, else nanoGPT for a .bin file,
  // else text. Throws [data] naming the file for every malformed or unreadable input.
  static TokenData open(const std::string& path, TokenFormat format = TokenFormat::automatic);
  // Owns the tokens (format() is nanogpt: raw uint16). Throws [data] for fewer than 2 tokens.
  static TokenData from_tokens(std::vector<uint16_t> tokens, std::string description);

  int64_t size() const { return size_; }
  int32_t at(int64_t i) const;
  void copy(int64_t start, int64_t count, int32_t* dst) const;  // [start, start + count) must be in range
  // Throws [data] naming the file and position of the first token in [begin, end) that is not
  // below vocab: one streaming pass, for checking a split (the validation split, say) before
  // training starts. (The batch loader checks every token it loads as well.)
  void check_tokens_below(int64_t begin, int64_t end, int64_t vocab) const;
  TokenFormat format() const { return format_; }
  const std::string& description() const { return description_; }
  int64_t vocab_hint() const { return format_ == TokenFormat::text ? 256 : dwords_ ? int64_t(1) << 31 : 65536; }

  TokenData(TokenData&& other) noexcept;
  TokenData& operator=(TokenData&& other) noexcept;  // the moved-from object is left empty
  TokenData(const TokenData&) = delete;
  TokenData& operator=(const TokenData&) = delete;
  ~TokenData() = default;

 private:
  TokenData() = default;

  MappedFile file_;               // empty for from_tokens
  std::vector<uint16_t> owned_;   // from_tokens only
  const uint8_t* bytes_ = nullptr;   // text: one token per byte
  const uint16_t* words_ = nullptr;  // llmc / nanogpt / owned: one token per uint16
  const uint32_t* dwords_ = nullptr; // llmc Llama 3 files: one token per uint32
  int64_t size_ = 0;
  TokenFormat format_ = TokenFormat::text;
  std::string description_;
};

// Writes an llm.c token file (magic 20240520, version 1, uint16 tokens) atomically: an
// existing file at path survives any failure. Throws [data].
void write_llmc_tokens(const std::string& path, std::span<const uint16_t> tokens);

}  // namespace memfit
