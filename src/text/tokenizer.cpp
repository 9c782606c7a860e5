#include "text/tokenizer.hpp"

#include <algorithm>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "core/error.hpp"
#include "io/json_errors.hpp"
#include "io/mapped_file.hpp"
#include "text/utf8.hpp"

namespace memfit::text {

namespace {

constexpr std::string_view kPiece = "text";

// Whether bytes hold '\n' followed by a byte a chunk may start with (see is_line_start).
bool spans_line_start(std::string_view bytes) {
  for (size_t i = 0; i + 1 < bytes.size(); ++i)
    if (Tokenizer::is_line_start(bytes, i + 1)) return true;
  return false;
}

// A vocabulary token as the bytes it stands for, in byte-level spelling; the token itself when
// it is not spelled in the byte-level alphabet.
std::string byte_level_bytes(const std::string& token) {
  std::string bytes;
  for (size_t i = 0; i < token.size();) {
    const size_t n = utf8_char_length(static_cast<unsigned char>(token[i]));
    uint32_t cp = static_cast<unsigned char>(token[i]) & (n == 1 ? 0x7F : 0xFF >> (n + 1));
    for (size_t j = 1; j < n && i + j < token.size(); ++j)
      cp = (cp << 6) | (static_cast<unsigned char>(token[i + j]) & 0x3F);
    const auto byte = byte_level_byte(cp);
    if (!byte) return token;
    bytes += char(*byte);
    i += n;
  }
  return bytes;
}

std::vector<AddedToken> parse_added_tokens(const nlohmann::json& list) {
  std::vector<AddedToken> added;
  if (list.is_null()) return added;
  MEMFIT_CHECK(list.is_array(), kPiece, "added_tokens is not an array");
  for (const auto& t : list) {
    AddedToken token;
    token.content = t.at("content").get<std::string>();
    token.id = t.at("id").get<uint32_t>();
    token.special = t.value("special", false);
    token.normalized = t.value("normalized", !token.special);
    for (const char* option : {"single_word", "lstrip", "rstrip"})
      MEMFIT_CHECK(!t.value(option, false), kPiece, "added token '{}' with {} is not supported", token.content,
                   option);
    MEMFIT_CHECK(!token.content.empty(), kPiece, "added token {} is empty", token.id);
    added.push_back(std::move(token));
  }
  return added;
}

}  // namespace

Tokenizer Tokenizer::load(const std::string& path) {
  std::string file = path;
  if (std::filesystem::is_directory(path)) file = (std::filesystem::path(path) / "tokenizer.json").string();
  const MappedFile mapped = MappedFile::open(file, kPiece);
  return from_json_text(std::string_view(reinterpret_cast<const char*>(mapped.data()), mapped.size()), file);
}

Tokenizer Tokenizer::from_json_text(std::string_view json_text, const std::string& description) {
  nlohmann::json spec;
  try {
    spec = nlohmann::json::parse(json_text);
  } catch (const nlohmann::json::exception& e) {
    throw Error(kPiece, fmt::format("{}: not a valid tokenizer.json: {}", description, printable_error_text(e)));
  }
  Tokenizer t;
  t.description_ = description;
  try {
    MEMFIT_CHECK(spec.is_object() && spec.contains("model"), kPiece, "no \"model\" object");
    const nlohmann::json& model = spec["model"];
    // Files from older tokenizers versions leave out the BPE model's "type".
    const std::string type = model.value("type", model.contains("merges") ? "BPE" : "");
    MEMFIT_CHECK(type == "BPE", kPiece, "model type '{}' is not supported (memfit reads BPE: byte-level or "
                 "SentencePiece-style with byte fallback)", type);
    t.model_ = BpeModel::from_json(model);
    t.normalizer_ = Normalizer::from_json(spec.value("normalizer", nlohmann::json()));
    t.pre_tokenizer_ = PreTokenizer::from_json(spec.value("pre_tokenizer", nlohmann::json()));
    t.decoder_ = Decoder::from_json(spec.value("decoder", nlohmann::json()));
    t.added_ = parse_added_tokens(spec.value("added_tokens", nlohmann::json()));
  } catch (const Error& e) {
    const std::string message = e.what();
    const std::string prefix = "[text] ", file_prefix = "tokenizer.json: ";
    std::string detail = message.rfind(prefix, 0) == 0 ? message.substr(prefix.size()) : message;
    if (detail.rfind(file_prefix, 0) == 0) detail = detail.substr(file_prefix.size());
    throw Error(kPiece, fmt::format("{}: {}", description, detail));
  } catch (const nlohmann::json::exception& e) {
    throw Error(kPiece, fmt::format("{}: unexpected tokenizer.json content: {}", description, printable_error_text(e)));
  }
  t.vocab_size_ = t.model_.max_id() + 1;
  for (const auto& a : t.added_) t.vocab_size_ = std::max(t.vocab_size_, a.id + 1);
  t.added_by_id_.assign(t.vocab_size_, nullptr);
  for (auto& table : t.added_by_first_byte_) table.assign(256, {});
  for (size_t i = 0; i < t.added_.size(); ++i) {
    const AddedToken& a = t.added_[i];
    t.added_by_id_[a.id] = &a;
    t.added_by_first_byte_[a.normalized][static_cast<unsigned char>(a.content[0])].push_back(i);
  }
  for (auto& table : t.added_by_first_byte_)
    for (auto& list : table)
      std::stable_sort(list.begin(), list.end(),
                       [&](size_t a, size_t b) { return t.added_[a].content.size() > t.added_[b].content.size(); });
  t.splits_at_line_starts_ = t.check_line_start_splits();
  return t;
}

bool Tokenizer::check_line_start_splits() const {
  for (const auto& a : added_)
    if (a.content.find('\n') != std::string::npos) return false;
  if (model_.unk_may_cross_newline() || pre_tokenizer_.prefixes_every_split_piece()) return false;  // tokenizer_fuzz
  for (const auto& [token, id] : model_.vocab()) {
    std::string plain = token;
    replace_all(plain, "\xE2\x96\x81", " ");  // SentencePiece's "▁"
    if (spans_line_start(plain) || spans_line_start(byte_level_bytes(token))) return false;
  }
  return true;
}

bool Tokenizer::starts_with_letter_or_number(std::string_view text) {
  static const Regex letter_or_number("^[\\p{L}\\p{N}]");
  if (text.empty()) return false;
  const std::string_view first = text.substr(0, utf8_char_length(static_cast<unsigned char>(text[0])));
  if (!is_valid_utf8(first)) return false;
  bool found = false;
  letter_or_number.for_each_match(first, [&](size_t, size_t) { found = true; });
  return found;
}

std::optional<uint32_t> Tokenizer::token_id(std::string_view token) const {
  for (const auto& a : added_)
    if (a.content == token) return a.id;
  return model_.token_id(token);
}

// Leftmost-longest matching of the added tokens of one kind, as `tokenizers`' Aho-Corasick does.
void Tokenizer::split_on_added(std::string_view text, bool normalized, size_t base, std::vector<Segment>& out) const {
  const auto& table = added_by_first_byte_[normalized];
  size_t last = 0;
  for (size_t i = 0; i < text.size();) {
    const AddedToken* match = nullptr;
    for (size_t index : table[static_cast<unsigned char>(text[i])]) {
      const AddedToken& a = added_[index];
      if (text.compare(i, a.content.size(), a.content) == 0) {
        match = &a;
        break;
      }
    }
    if (!match) {
      ++i;
      continue;
    }
    if (i > last) out.push_back({text.substr(last, i - last), std::nullopt, base + last});
    out.push_back({text.substr(i, match->content.size()), match->id, base + i});
    i += match->content.size();
    last = i;
  }
  if (last < text.size()) out.push_back({text.substr(last), std::nullopt, base + last});
}

void Tokenizer::encode_segment(const Segment& segment, bool at_text_start, std::vector<uint32_t>& ids) const {
  const bool at_start = segment.offset == 0;
  std::string normalized(segment.text);
  normalizer_.apply(normalized, at_text_start || !at_start);
  std::vector<Segment> parts;
  split_on_added(normalized, true, 0, parts);
  std::vector<Piece> pieces;
  for (const Segment& part : parts) {
    if (part.added) {
      ids.push_back(*part.added);
      continue;
    }
    const bool first = at_start && part.offset == 0;
    pieces.clear();
    pieces.push_back({std::string(part.text), first && at_text_start, first && !at_text_start});
    pre_tokenizer_.apply(pieces);
    for (const Piece& piece : pieces) model_.encode_word(piece.text, ids);
  }
}

void Tokenizer::encode_into(std::string_view text, bool at_text_start, std::vector<uint32_t>& ids) const {
  const std::string valid = to_valid_utf8(text);
  std::vector<Segment> segments;
  split_on_added(valid, false, 0, segments);
  for (const Segment& segment : segments) {
    if (segment.added) ids.push_back(*segment.added);
    else encode_segment(segment, at_text_start, ids);
  }
}

std::vector<uint32_t> Tokenizer::encode(std::string_view text, bool at_text_start) const {
  std::vector<uint32_t> ids;
  encode_into(text, at_text_start, ids);
  return ids;
}

std::string Tokenizer::decode(std::span<const uint32_t> ids) const {
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (uint32_t id : ids) {
    if (id < added_by_id_.size() && added_by_id_[id]) {
      tokens.push_back(added_by_id_[id]->content);
      continue;
    }
    const std::string* token = model_.token_of(id);
    MEMFIT_CHECK(token != nullptr, kPiece, "{}: cannot decode id {}: not in the vocabulary", description_, id);
    tokens.push_back(*token);
  }
  return decoder_.decode(std::move(tokens));
}

}  // namespace memfit::text
