#include "io/safetensors_shards.hpp"

#include <cctype>
#include <filesystem>
#include <set>

#include <nlohmann/json.hpp>

#include "core/error.hpp"
#include "io/json_errors.hpp"
#include "io/mapped_file.hpp"

namespace memfit {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr std::string_view kPiece = "safetensors";

// A shard named by an index must be a plain file name next to it: no directories, so an index
// cannot make memfit read files elsewhere.
void check_shard_name(const std::string& index, const std::string& shard) {
  MEMFIT_CHECK(!shard.empty() && shard.find('/') == std::string::npos && shard.find('\\') == std::string::npos &&
                   shard != "." && shard != "..",
               kPiece, "{}: shard '{}' is not a file name in the index's directory", index, shard);
  MEMFIT_CHECK(shard.ends_with(".safetensors"), kPiece, "{}: shard '{}' is not a .safetensors file", index, shard);
}

json parse_index(const std::string& index_path) {
  const MappedFile file = MappedFile::open(index_path, kPiece);
  const auto* begin = reinterpret_cast<const char*>(file.data());
  try {
    return json::parse(begin, begin + file.size());
  } catch (const json::exception& e) {
    throw Error(kPiece, fmt::format("{}: not valid JSON: {}", index_path, printable_error_text(e)));
  }
}

bool is_shard_file_name(const std::string& name) {
  // model-00001-of-00003.safetensors, as transformers names them (five digits or more).
  constexpr std::string_view head = "model-", mid = "-of-", tail = ".safetensors";
  if (!name.starts_with(head) || !name.ends_with(tail)) return false;
  const std::string body = name.substr(head.size(), name.size() - head.size() - tail.size());
  const size_t of = body.find(mid);
  if (of == std::string::npos || of == 0 || of + mid.size() == body.size()) return false;
  auto digits = [](std::string_view s) {
    for (char c : s)
      if (!std::isdigit(static_cast<unsigned char>(c))) return false;
    return true;
  };
  return digits(std::string_view(body).substr(0, of)) && digits(std::string_view(body).substr(of + mid.size()));
}

}  // namespace

SafetensorsShards::SafetensorsShards(const std::string& path) {
  fs::path p(path);
  if (fs::is_directory(p)) {
    if (fs::exists(p / kSingleSafetensorsName))
      p /= kSingleSafetensorsName;
    else if (fs::exists(p / kSafetensorsIndexName))
      p /= kSafetensorsIndexName;
    else
      throw Error(kPiece, fmt::format("{}: holds neither {} nor {}", path, kSingleSafetensorsName,
                                      kSafetensorsIndexName));
  }
  description_ = p.string();
  if (description_.ends_with(".json")) {
    open_index(description_);
  } else {
    shards_.push_back(std::make_unique<SafetensorsReader>(description_));
    for (const SafetensorsEntry& e : shards_.back()->entries()) {
      by_name_.emplace(e.name, tensors_.size());
      tensors_.push_back({shards_.back().get(), &e});
    }
  }
}

void SafetensorsShards::open_index(const std::string& index_path) {
  const json index = parse_index(index_path);
  MEMFIT_CHECK(index.is_object() && index.contains("weight_map") && index["weight_map"].is_object(), kPiece,
               "{}: no \"weight_map\" object (not a safetensors index)", index_path);
  const json& weight_map = index["weight_map"];
  MEMFIT_CHECK(!weight_map.empty(), kPiece, "{}: the weight_map names no tensor", index_path);
  std::map<std::string, std::set<std::string>> expected;  // shard -> tensors the index puts there
  for (const auto& [tensor, shard] : weight_map.items()) {
    MEMFIT_CHECK(shard.is_string(), kPiece, "{}: the shard of tensor '{}' is not a string", index_path, tensor);
    check_shard_name(index_path, shard.get<std::string>());
    expected[shard.get<std::string>()].insert(tensor);
  }
  const fs::path dir = fs::path(index_path).parent_path();
  std::map<std::string, std::string> first_shard_of;  // tensor -> shard holding it
  for (const auto& [shard, names] : expected) {
    const std::string shard_path = (dir / shard).string();
    MEMFIT_CHECK(fs::exists(shard_path), kPiece, "{}: shard '{}' is missing", index_path, shard);
    shards_.push_back(std::make_unique<SafetensorsReader>(shard_path));
    const SafetensorsReader& reader = *shards_.back();
    for (const SafetensorsEntry& e : reader.entries()) {
      const auto [seen, fresh] = first_shard_of.emplace(e.name, shard);
      MEMFIT_CHECK(fresh, kPiece, "{}: tensor '{}' is in two shards, '{}' and '{}'", index_path, e.name, seen->second,
                   shard);
      MEMFIT_CHECK(names.count(e.name), kPiece, "{}: shard '{}' holds tensor '{}', which the index puts {}", index_path,
                   shard, e.name,
                   weight_map.contains(e.name) ? "in '" + weight_map[e.name].get<std::string>() + "'" : "nowhere");
      by_name_.emplace(e.name, tensors_.size());
      tensors_.push_back({&reader, &e});
    }
    for (const std::string& name : names)
      MEMFIT_CHECK(reader.find(name) != nullptr, kPiece, "{}: the index puts tensor '{}' in shard '{}', which lacks it",
                   index_path, name, shard);
  }
}

const SafetensorsShards::Located* SafetensorsShards::find(std::string_view name) const {
  const auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : &tensors_[it->second];
}

void SafetensorsShards::release(const Located& tensor) const {
  tensor.shard->release(*tensor.entry);
}

uint64_t parse_shard_size(std::string_view text) {
  size_t digits = 0;
  while (digits < text.size() && std::isdigit(static_cast<unsigned char>(text[digits]))) ++digits;
  MEMFIT_CHECK(digits > 0 && digits <= 15, kPiece,
               "shard size '{}' is not a whole number with an optional unit (KB, MB, GB, KiB, MiB, GiB)", text);
  const uint64_t number = std::stoull(std::string(text.substr(0, digits)));
  std::string unit(text.substr(digits));
  for (char& c : unit) c = char(std::toupper(static_cast<unsigned char>(c)));
  static const std::map<std::string, uint64_t> kUnits = {
      {"", 1},          {"B", 1},          {"KB", 1000},       {"MB", 1000'000}, {"GB", 1000'000'000},
      {"KIB", 1 << 10}, {"MIB", 1 << 20}, {"GIB", uint64_t(1) << 30}};
  const auto it = kUnits.find(unit);
  MEMFIT_CHECK(it != kUnits.end(), kPiece, "shard size '{}': unknown unit '{}' (KB, MB, GB, KiB, MiB, GiB)", text,
               text.substr(digits));
  MEMFIT_CHECK(number > 0, kPiece, "shard size '{}' must be more than zero", text);
  return number * it->second;
}

std::vector<std::string> write_safetensors_shards(const std::string& directory,
                                                  std::span<const SafetensorsTensor> tensors, uint64_t max_shard_bytes,
                                                  const std::map<std::string, std::string>& metadata) {
  MEMFIT_CHECK(max_shard_bytes > 0, kPiece, "{}: a shard size of 0 bytes", directory);
  // Group in the given order, as transformers does.
  std::vector<std::vector<size_t>> groups;
  uint64_t open_bytes = 0, total = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const uint64_t bytes = dtype_bytes(tensors[i].dtype, tensors[i].shape.numel());
    total += bytes;
    if (groups.empty() || open_bytes + bytes > max_shard_bytes) {
      groups.emplace_back();
      open_bytes = 0;
    }
    groups.back().push_back(i);
    open_bytes += bytes;
  }
  if (groups.empty()) groups.emplace_back();
  const bool single = groups.size() == 1;
  const fs::path dir(directory);
  std::vector<std::string> written;
  for (size_t g = 0; g < groups.size(); ++g) {
    const std::string name = single ? std::string(kSingleSafetensorsName)
                                    : fmt::format("model-{:05d}-of-{:05d}.safetensors", g + 1, groups.size());
    std::vector<SafetensorsTensor> part;
    for (size_t i : groups[g]) part.push_back(tensors[i]);
    write_safetensors((dir / name).string(), part, metadata);
    written.push_back(name);
  }
  if (!single) {
    json weight_map = json::object();
    for (size_t g = 0; g < groups.size(); ++g)
      for (size_t i : groups[g]) weight_map[tensors[i].name] = written[g];
    const std::string text = json{{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}}.dump(2) + "\n";
    AtomicFileWriter out((dir / kSafetensorsIndexName).string(), kPiece);
    out.write(text.data(), text.size());
    out.commit();
    written.emplace_back(kSafetensorsIndexName);
  }
  // Only now that the new set is complete do the files of an earlier save go.
  const std::set<std::string> keep(written.begin(), written.end());
  std::error_code ec;
  for (const fs::directory_entry& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    const bool ours = is_shard_file_name(name) || name == kSingleSafetensorsName || name == kSafetensorsIndexName;
    if (ours && !keep.count(name)) fs::remove(e.path(), ec);
  }
  return written;
}

}  // namespace memfit
