// Test helpers that damage checkpoints the way a disk, a crash or a person would: raw byte
// edits, and edits re-signed consistently (the rank file's trailing XXH3, the manifest's entry
// and the manifest's own checksum recomputed with libxxhash here) so that a mutation reaches
// the structural check behind the checksums. The layout is the documented one
// (train/checkpoint_rank_file.hpp), read independently of memfit's reader.
#pragma once

#include <xxhash.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace memfit::test {

inline std::string read_bytes(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

inline void write_bytes(const std::filesystem::path& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << bytes;
}

inline uint64_t get_le64(const std::string& s, size_t at) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = v << 8 | uint8_t(s[at + size_t(i)]);
  return v;
}

inline std::string le64(uint64_t v) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[size_t(i)] = char(v >> (8 * i));
  return s;
}

struct RankFileParts {
  nlohmann::json header;
  std::string data;  // the tensor bytes (plus anything a test appends)
};

inline RankFileParts split_rank_file(const std::string& bytes) {
  const uint64_t len = get_le64(bytes, 8);
  return RankFileParts{nlohmann::json::parse(bytes.substr(16, len)), bytes.substr(16 + len, bytes.size() - 16 - len - 8)};
}

// The file with its trailing checksum recomputed over everything before it.
inline std::string join_rank_file(const RankFileParts& parts) {
  const std::string header = parts.header.dump();
  std::string body = std::string("MEMFITCK") + le64(header.size()) + header + parts.data;
  return body + le64(XXH3_64bits(body.data(), body.size()));
}

inline std::string sign_manifest(nlohmann::json j) {
  j.erase("checksum");
  const std::string body = j.dump();
  j["checksum"] = fmt::format("xxh3:{:016x}", XXH3_64bits(body.data(), body.size()));
  return j.dump(2) + "\n";
}

// Rewrites rank file `file` of step directory `dir` and re-signs the manifest's entry for it.
inline void replace_rank_file_signed(const std::filesystem::path& dir, const std::string& file,
                                     const std::string& bytes) {
  write_bytes(dir / file, bytes);
  nlohmann::json m = nlohmann::json::parse(read_bytes(dir / "manifest.json"));
  for (auto& entry : m["ranks"])
    if (entry["file"] == file) {
      entry["bytes"] = bytes.size();
      entry["xxh3"] = fmt::format("{:016x}", get_le64(bytes, bytes.size() - 8));
    }
  write_bytes(dir / "manifest.json", sign_manifest(m));
}

}  // namespace memfit::test
