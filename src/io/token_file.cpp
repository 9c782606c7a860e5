#include "io/token_file.hpp"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <limits>
#include <utility>

#include "core/error.hpp"

namespace memfit {

namespace {

constexpr std::string_view kPiece = "data";
// llm.c: 256 little-endian int32 (magic, version, token count, unused), then the tokens:
// uint16 in GPT-2 files, uint32 in Llama 3 files (llm.c's dev/data/data_common.py).
constexpr int32_t kLlmcMagic = 20240520;
constexpr int32_t kLlmcVersionUint16 = 1;
constexpr int32_t kLlmcMagicLlama3 = 20240801;
constexpr int32_t kLlmcVersionLlama3 = 7;
constexpr uint64_t kLlmcHeaderBytes = 256 * sizeof(int32_t);
constexpr int64_t kMinTokens = 2;  // one input and its target

int32_t read_le_i32(const std::byte* p) {
  int32_t v;
  std::memcpy(&v, p, 4);  // little-endian host asserted in float_convert.cpp
  return v;
}

bool starts_with_llmc_magic(const MappedFile& file) {
  if (file.size() < 4) return false;
  const int32_t magic = read_le_i32(file.data());
  return magic == kLlmcMagic || magic == kLlmcMagicLlama3;
}

// An llm.c header whose magic is damaged (zeroed, a flipped bit): the version field holds an
// llm.c version and either the token count matches the file size or the reserved fields are
// all zero. Raw uint16 tokens look like that by chance with probability far below 2^-32.
bool looks_like_llmc_without_magic(const MappedFile& file) {
  if (file.size() < kLlmcHeaderBytes) return false;
  const int32_t version = read_le_i32(file.data() + 4);
  if (version != kLlmcVersionUint16 && version != kLlmcVersionLlama3) return false;
  const int32_t count = read_le_i32(file.data() + 8);
  const uint64_t width = version == kLlmcVersionLlama3 ? 4 : 2;
  if (count >= 0 && kLlmcHeaderBytes + width * uint64_t(count) == file.size()) return true;
  const std::byte* reserved = file.data() + 12;
  return std::all_of(reserved, file.data() + kLlmcHeaderBytes, [](std::byte b) { return b == std::byte{0}; });
}

TokenFormat detect_format(const MappedFile& file) {
  if (starts_with_llmc_magic(file)) return TokenFormat::llmc;
  // Strict about which format a file is: a damaged llm.c file must not be read, header and
  // all, as nanoGPT tokens.
  MEMFIT_CHECK(!looks_like_llmc_without_magic(file), kPiece,
               "{}: llm.c header with a bad magic {} (expected {} or {}); pass --data-format nanogpt if it really is "
               "raw tokens", file.path(), read_le_i32(file.data()), kLlmcMagic, kLlmcMagicLlama3);
  if (std::filesystem::path(file.path()).extension() == ".bin") return TokenFormat::nanogpt;
  return TokenFormat::text;
}

// llm.c writes its header as 256 zeroed int32 with only magic, version and count set.
void check_llmc_reserved_fields(const MappedFile& file) {
  for (uint64_t field = 3; field < kLlmcHeaderBytes / 4; ++field) {
    const int32_t value = read_le_i32(file.data() + 4 * field);
    MEMFIT_CHECK(value == 0, kPiece, "{}: llm.c header field {} is {}, but llm.c leaves fields 3 to 255 zero",
                 file.path(), field, value);
  }
}

}  // namespace

TokenFormat parse_token_format(std::string_view name) {
  if (name == "auto") return TokenFormat::automatic;
  if (name == "llmc") return TokenFormat::llmc;
  if (name == "nanogpt") return TokenFormat::nanogpt;
  if (name == "text") return TokenFormat::text;
  throw Error(kPiece, fmt::format("unknown token format '{}' (expected auto, llmc, nanogpt or text)", name));
}

std::string_view token_format_name(TokenFormat format) {
  switch (format) {
    case TokenFormat::automatic: return "auto";
    case TokenFormat::llmc: return "llmc";
    case TokenFormat::nanogpt: return "nanogpt";
    case TokenFormat::text: return "text";
  }
  MEMFIT_ASSERT(false, "unknown token format {}", int(format));
}

TokenData TokenData::open(const std::string& path, TokenFormat format) {
  MappedFile file = MappedFile::open(path, kPiece);
  MEMFIT_CHECK(file.size() > 0, kPiece, "{}: file is empty", path);
  if (format == TokenFormat::automatic) format = detect_format(file);

  TokenData data;
  data.format_ = format;
  switch (format) {
    case TokenFormat::llmc: {
      MEMFIT_CHECK(file.size() >= kLlmcHeaderBytes, kPiece,
                   "{}: {} bytes is shorter than the {}-byte llm.c header", path, file.size(), kLlmcHeaderBytes);
      const int32_t magic = read_le_i32(file.data());
      const int32_t version = read_le_i32(file.data() + 4);
      const int32_t count = read_le_i32(file.data() + 8);
      MEMFIT_CHECK(magic == kLlmcMagic || magic == kLlmcMagicLlama3, kPiece,
                   "{}: bad llm.c magic {} (expected {} for GPT-2 files or {} for Llama 3 files)", path, magic,
                   kLlmcMagic, kLlmcMagicLlama3);
      const bool llama3 = magic == kLlmcMagicLlama3;
      const int32_t want = llama3 ? kLlmcVersionLlama3 : kLlmcVersionUint16;
      MEMFIT_CHECK(version == want, kPiece, "{}: unknown llm.c version {} for magic {} (expected {})", path, version,
                   magic, want);
      MEMFIT_CHECK(count >= 0, kPiece, "{}: negative token count {} in the llm.c header", path, count);
      check_llmc_reserved_fields(file);
      const uint64_t width = llama3 ? 4 : 2;
      const uint64_t expected = kLlmcHeaderBytes + width * uint64_t(count);
      MEMFIT_CHECK(file.size() == expected, kPiece,
                   "{}: header says {} tokens, so the file should be {} bytes, but it is {} bytes ({})", path, count,
                   expected, file.size(), file.size() < expected ? "truncated" : "trailing bytes");
      if (llama3) data.dwords_ = reinterpret_cast<const uint32_t*>(file.data() + kLlmcHeaderBytes);  // page + 1024
      else data.words_ = reinterpret_cast<const uint16_t*>(file.data() + kLlmcHeaderBytes);
      data.size_ = count;
      break;
    }
    case TokenFormat::nanogpt:
      MEMFIT_CHECK(file.size() % 2 == 0, kPiece,
                   "{}: {} bytes is an odd size, not a whole number of uint16 tokens (nanoGPT format)", path,
                   file.size());
      data.words_ = reinterpret_cast<const uint16_t*>(file.data());  // page-aligned mapping
      data.size_ = int64_t(file.size() / 2);
      break;
    case TokenFormat::text:
      data.bytes_ = reinterpret_cast<const uint8_t*>(file.data());
      data.size_ = int64_t(file.size());
      break;
    case TokenFormat::automatic:
      MEMFIT_ASSERT(false, "format left undetected");
  }
  MEMFIT_CHECK(data.size_ >= kMinTokens, kPiece, "{}: {} token(s) is too few (need at least {})", path, data.size_,
               kMinTokens);
  data.description_ = fmt::format("{} ({}, {} tokens)", path, token_format_name(format), data.size_);
  data.file_ = std::move(file);  // the mapping's address does not change on move
  return data;
}

TokenData TokenData::from_tokens(std::vector<uint16_t> tokens, std::string description) {
  MEMFIT_CHECK(int64_t(tokens.size()) >= kMinTokens, kPiece, "{}: {} token(s) is too few (need at least {})",
               description, tokens.size(), kMinTokens);
  TokenData data;
  data.owned_ = std::move(tokens);
  data.words_ = data.owned_.data();
  data.size_ = int64_t(data.owned_.size());
  data.format_ = TokenFormat::nanogpt;
  data.description_ = std::move(description);
  return data;
}

TokenData::TokenData(TokenData&& other) noexcept
    : file_(std::move(other.file_)),
      owned_(std::move(other.owned_)),  // a moved vector keeps its buffer, so words_ stays valid
      bytes_(std::exchange(other.bytes_, nullptr)),
      words_(std::exchange(other.words_, nullptr)),
      dwords_(std::exchange(other.dwords_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      format_(other.format_),
      description_(std::move(other.description_)) {}

TokenData& TokenData::operator=(TokenData&& other) noexcept {
  if (this != &other) {
    file_ = std::move(other.file_);
    owned_ = std::move(other.owned_);
    bytes_ = std::exchange(other.bytes_, nullptr);
    words_ = std::exchange(other.words_, nullptr);
    dwords_ = std::exchange(other.dwords_, nullptr);
    size_ = std::exchange(other.size_, 0);
    format_ = other.format_;
    description_ = std::move(other.description_);
  }
  return *this;
}

int32_t TokenData::at(int64_t i) const {
  MEMFIT_ASSERT(i >= 0 && i < size_, "token {} out of range [0, {}) in {}", i, size_, description_);
  // A uint32 token past INT32_MAX comes out negative, which the data loader refuses by name.
  return bytes_ ? int32_t(bytes_[i]) : dwords_ ? int32_t(dwords_[i]) : int32_t(words_[i]);
}

void TokenData::copy(int64_t start, int64_t count, int32_t* dst) const {
  MEMFIT_ASSERT(start >= 0 && count >= 0 && start <= size_ - count, "tokens [{}, {}) out of range [0, {}) in {}",
                start, start + count, size_, description_);
  if (bytes_) {
    for (int64_t i = 0; i < count; ++i) dst[i] = int32_t(bytes_[start + i]);
  } else if (dwords_) {
    for (int64_t i = 0; i < count; ++i) dst[i] = int32_t(dwords_[start + i]);
  } else {
    for (int64_t i = 0; i < count; ++i) dst[i] = int32_t(words_[start + i]);
  }
}

void TokenData::check_tokens_below(int64_t begin, int64_t end, int64_t vocab) const {
  MEMFIT_ASSERT(begin >= 0 && begin <= end && end <= size_, "tokens [{}, {}) out of range [0, {}) in {}", begin, end,
                size_, description_);
  // Branch-free maximum per block, so the pass runs at memory speed; the position is searched
  // only in the block that fails.
  constexpr int64_t kBlock = 4096;
  for (int64_t b = begin; b < end; b += kBlock) {
    const int64_t e = std::min(end, b + kBlock);
    uint32_t highest = 0;
    if (bytes_) for (int64_t i = b; i < e; ++i) highest = std::max<uint32_t>(highest, bytes_[i]);
    else if (dwords_) for (int64_t i = b; i < e; ++i) highest = std::max<uint32_t>(highest, dwords_[i]);
    else for (int64_t i = b; i < e; ++i) highest = std::max<uint32_t>(highest, words_[i]);
    if (int64_t(highest) < vocab) continue;
    for (int64_t i = b; i < e; ++i) {
      const uint32_t t = bytes_ ? bytes_[i] : dwords_ ? dwords_[i] : words_[i];
      MEMFIT_CHECK(int64_t(t) < vocab, kPiece, "token {} at position {} of {} is outside the model's vocabulary of {}",
                   t, i, description_, vocab);
    }
  }
}

void write_llmc_tokens(const std::string& path, std::span<const uint16_t> tokens) {
  MEMFIT_CHECK(tokens.size() <= uint64_t(std::numeric_limits<int32_t>::max()), kPiece,
               "{}: {} tokens do not fit the llm.c header's int32 count", path, tokens.size());
  int32_t header[256] = {};
  header[0] = kLlmcMagic;
  header[1] = kLlmcVersionUint16;
  header[2] = int32_t(tokens.size());
  AtomicFileWriter out(path, kPiece);
  out.write(header, sizeof(header));
  out.write(tokens.data(), tokens.size_bytes());
  out.commit();
}

}  // namespace memfit
