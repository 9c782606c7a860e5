#include "text/bpe.hpp"

#include <atomic>
#include <queue>

#include <nlohmann/json.hpp>

#include "core/error.hpp"
#include "text/utf8.hpp"

namespace memfit::text {

namespace {

constexpr std::string_view kPiece = "text";
constexpr size_t kMaxCachedWordBytes = 256, kMaxCachedWords = size_t(1) << 16;

std::atomic<uint64_t> next_cache_key{1};

struct WordCache {
  uint64_t key = 0;
  std::unordered_map<std::string, std::vector<uint32_t>, StringHash, std::equal_to<>> words;
};

std::pair<std::string, std::string> parse_merge(const nlohmann::json& merge) {
  // Older files write "a b", newer ones ["a", "b"] (which allows spaces inside tokens).
  if (merge.is_string()) {
    const std::string text = merge.get<std::string>();
    const size_t space = text.find(' ');
    MEMFIT_CHECK(space != std::string::npos && space > 0 && space + 1 < text.size() &&
                     text.find(' ', space + 1) == std::string::npos,
                 kPiece, "tokenizer.json: merge '{}' is not two tokens separated by one space", text);
    return {text.substr(0, space), text.substr(space + 1)};
  }
  MEMFIT_CHECK(merge.is_array() && merge.size() == 2 && merge[0].is_string() && merge[1].is_string(), kPiece,
               "tokenizer.json: a merge is neither \"a b\" nor [\"a\", \"b\"]: {}", merge.dump());
  return {merge[0].get<std::string>(), merge[1].get<std::string>()};
}

}  // namespace

BpeModel BpeModel::from_json(const nlohmann::json& model) {
  BpeModel bpe;
  bpe.cache_key_ = next_cache_key++;
  MEMFIT_CHECK(model.value("dropout", nlohmann::json()).is_null(), kPiece,
               "tokenizer.json: BPE dropout is not supported (it makes encoding random)");
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    const nlohmann::json value = model.value(key, nlohmann::json());
    MEMFIT_CHECK(value.is_null() || value == "", kPiece, "tokenizer.json: BPE {} {} is not supported", key,
                 value.dump());
  }
  bpe.byte_fallback_ = model.value("byte_fallback", false);
  bpe.fuse_unk_ = model.value("fuse_unk", false);
  bpe.ignore_merges_ = model.value("ignore_merges", false);
  const nlohmann::json& vocab = model.at("vocab");
  MEMFIT_CHECK(vocab.is_object(), kPiece, "tokenizer.json: model.vocab is not an object");
  for (const auto& [token, id] : vocab.items()) {
    MEMFIT_CHECK(id.is_number_unsigned() && id.get<uint64_t>() < (uint64_t(1) << 31), kPiece,
                 "tokenizer.json: vocabulary id of '{}' is not an id: {}", token, id.dump());
    const auto value = id.get<uint32_t>();
    bpe.vocab_.emplace(token, value);
    bpe.max_id_ = std::max(bpe.max_id_, value);
  }
  bpe.tokens_by_id_.assign(size_t(bpe.max_id_) + 1, nullptr);
  for (const auto& [token, id] : bpe.vocab_) bpe.tokens_by_id_[id] = &token;
  const nlohmann::json& merges = model.at("merges");
  MEMFIT_CHECK(merges.is_array(), kPiece, "tokenizer.json: model.merges is not an array");
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const auto [left, right] = parse_merge(merges[rank]);
    const auto l = bpe.token_id(left), r = bpe.token_id(right), result = bpe.token_id(left + right);
    MEMFIT_CHECK(l && r && result, kPiece, "tokenizer.json: merge '{} {}' uses a token not in the vocabulary", left,
                 right);
    bpe.merges_.emplace(pair_key(*l, *r), Merge{uint32_t(rank), *result});  // the first (lowest) rank wins
  }
  const nlohmann::json unk = model.value("unk_token", nlohmann::json());
  if (!unk.is_null()) {
    bpe.unk_id_ = bpe.token_id(unk.get<std::string>());
    MEMFIT_CHECK(bpe.unk_id_.has_value(), kPiece, "tokenizer.json: unk_token '{}' is not in the vocabulary",
                 unk.get<std::string>());
  }
  if (bpe.byte_fallback_)
    for (int b = 0; b < 256; ++b) bpe.byte_tokens_[size_t(b)] = bpe.token_id(fmt::format("<0x{:02X}>", b));
  return bpe;
}

std::optional<uint32_t> BpeModel::token_id(std::string_view token) const {
  const auto it = vocab_.find(token);
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

const std::string* BpeModel::token_of(uint32_t id) const {
  return id < tokens_by_id_.size() ? tokens_by_id_[id] : nullptr;
}

// One symbol per character; a character outside the vocabulary becomes its <0xNN> byte tokens
// (byte_fallback), else unk (runs of unknown characters fused with fuse_unk), else nothing. As in
// `tokenizers`, a pending unk is written only when the next in-vocabulary character comes.
void BpeModel::initial_symbols(std::string_view word, std::vector<uint32_t>& symbols,
                               std::vector<uint32_t>& lengths) const {
  std::optional<std::pair<uint32_t, uint32_t>> pending_unk;  // id, bytes
  auto flush_unk = [&] {
    if (!pending_unk) return;
    symbols.push_back(pending_unk->first);
    lengths.push_back(pending_unk->second);
    pending_unk.reset();
  };
  for (size_t i = 0; i < word.size();) {
    const size_t n = std::min(utf8_char_length(static_cast<unsigned char>(word[i])), word.size() - i);
    const std::string_view ch = word.substr(i, n);
    i += n;
    if (const auto id = token_id(ch)) {
      flush_unk();
      symbols.push_back(*id);
      lengths.push_back(uint32_t(n));
      continue;
    }
    if (byte_fallback_) {
      bool all = true;
      for (char c : ch) all = all && byte_tokens_[static_cast<unsigned char>(c)].has_value();
      if (all) {
        for (char c : ch) {
          symbols.push_back(*byte_tokens_[static_cast<unsigned char>(c)]);
          lengths.push_back(1);
        }
        continue;
      }
    }
    if (!unk_id_) continue;
    if (pending_unk && fuse_unk_) {
      pending_unk->second += uint32_t(n);
    } else {
      flush_unk();
      pending_unk = std::pair{*unk_id_, uint32_t(n)};
    }
  }
  flush_unk();
}

bool BpeModel::unk_may_cross_newline() const {
  if (!unk_id_ || token_id("\n")) return false;
  bool every_byte = byte_fallback_;
  for (const auto& b : byte_tokens_) every_byte = every_byte && b.has_value();
  return !every_byte;  // else every character has byte tokens: no <unk> ever
}

void BpeModel::encode_word(std::string_view word, std::vector<uint32_t>& ids) const {
  if (word.size() > kMaxCachedWordBytes) {
    merge_word(word, ids);
    return;
  }
  thread_local WordCache cache;
  if (cache.key != cache_key_ || cache.words.size() >= kMaxCachedWords) {
    cache.words.clear();
    cache.key = cache_key_;
  }
  if (const auto it = cache.words.find(word); it != cache.words.end()) {
    ids.insert(ids.end(), it->second.begin(), it->second.end());
    return;
  }
  const size_t before = ids.size();
  merge_word(word, ids);
  cache.words.emplace(std::string(word), std::vector<uint32_t>(ids.begin() + std::ptrdiff_t(before), ids.end()));
}

void BpeModel::merge_word(std::string_view word, std::vector<uint32_t>& ids) const {
  if (word.empty()) return;
  if (ignore_merges_) {
    if (const auto id = token_id(word)) {
      ids.push_back(*id);
      return;
    }
  }
  std::vector<uint32_t> symbols, lengths;
  initial_symbols(word, symbols, lengths);
  const int n = int(symbols.size());
  std::vector<int> prev(static_cast<size_t>(n)), next(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) prev[size_t(i)] = i - 1, next[size_t(i)] = i + 1 < n ? i + 1 : -1;
  struct Candidate {
    uint32_t rank;
    int pos;
    uint32_t result;
    bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> queue;
  auto push_pair = [&](int left) {
    const int right = next[size_t(left)];
    if (right < 0) return;
    const auto it = merges_.find(pair_key(symbols[size_t(left)], symbols[size_t(right)]));
    if (it != merges_.end()) queue.push({it->second.rank, left, it->second.result});
  };
  for (int i = 0; i + 1 < n; ++i) push_pair(i);
  while (!queue.empty()) {
    const Candidate top = queue.top();
    queue.pop();
    const auto pos = size_t(top.pos);
    if (lengths[pos] == 0 || next[pos] < 0) continue;
    const auto right = size_t(next[pos]);
    const auto it = merges_.find(pair_key(symbols[pos], symbols[right]));
    if (it == merges_.end() || it->second.result != top.result) continue;  // stale: a neighbour merged first
    symbols[pos] = top.result;
    lengths[pos] += lengths[right];
    lengths[right] = 0;
    next[pos] = next[right];
    if (next[right] >= 0) prev[size_t(next[right])] = top.pos;
    if (prev[pos] >= 0) push_pair(prev[pos]);
    push_pair(top.pos);
  }
  for (int i = 0; i >= 0 && i < n; i = next[size_t(i)]) ids.push_back(symbols[size_t(i)]);
}

const std::array<std::string, 256>& byte_level_alphabet() {
  static const std::array<std::string, 256> alphabet = [] {
    std::array<std::string, 256> a;
    uint32_t extra = 256;
    for (uint32_t b = 0; b < 256; ++b) {
      const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
      append_utf8(a[b], printable ? b : extra++);
    }
    return a;
  }();
  return alphabet;
}

std::optional<uint8_t> byte_level_byte(uint32_t cp) {
  static const std::unordered_map<uint32_t, uint8_t> inverse = [] {
    std::unordered_map<uint32_t, uint8_t> m;
    uint32_t extra = 256;
    for (uint32_t b = 0; b < 256; ++b) {
      const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
      m.emplace(printable ? b : extra++, uint8_t(b));
    }
    return m;
  }();
  const auto it = inverse.find(cp);
  if (it == inverse.end()) return std::nullopt;
  return it->second;
}

std::string to_byte_level(std::string_view bytes) {
  const auto& alphabet = byte_level_alphabet();
  std::string out;
  out.reserve(bytes.size() * 2);
  for (char c : bytes) out += alphabet[static_cast<unsigned char>(c)];
  return out;
}

}  // namespace memfit::text
