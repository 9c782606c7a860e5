// The global description of a checkpoint's tensors (checkpoint_layout.hpp) as the manifest
// holds it: merging the ranks' descriptions, its JSON both ways and the shard checks. Nothing
// here needs a program, so the manifest's reader (and its fuzz target) links without the
// graph; the pieces of a program are in checkpoint_pieces.cpp.
#include "train/checkpoint_layout.hpp"

#include <algorithm>
#include <limits>
#include <map>
#include <set>

#include <nlohmann/json.hpp>

#include "core/error.hpp"
#include "train/checkpoint_fields.hpp"

namespace memfit {

std::vector<SavedTensor> merge_descriptions(const std::vector<std::string>& per_rank) {
  std::vector<SavedTensor> tensors;
  std::vector<int64_t> param_index;  // of each tensor's parameter in the program
  std::map<std::string, size_t> index;
  for (size_t r = 0; r < per_rank.size(); ++r) {
    const nlohmann::json list = nlohmann::json::parse(per_rank[r], nullptr, false);
    MEMFIT_CHECK(list.is_array(), "checkpoint", "rank {} sent a malformed description of its tensors", r);
    for (const nlohmann::json& row : list) {
      MEMFIT_CHECK(row.is_array() && row.size() == 9, "checkpoint", "rank {} sent a malformed piece", r);
      SavedTensor t{row[0].get<std::string>(), row[1].get<std::string>(), row[2].get<std::string>(),
                    parse_dtype(row[3].get<std::string>()), Shape(row[4].get<std::vector<int64_t>>()), {}};
      const TensorShard shard{int(r), row[5].get<int64_t>(), row[6].get<int64_t>(), row[7].get<uint64_t>()};
      auto [it, fresh] = index.emplace(t.name, tensors.size());
      if (fresh) {
        tensors.push_back(t);
        param_index.push_back(row[8].get<int64_t>());
      }
      SavedTensor& known = tensors[it->second];
      MEMFIT_CHECK(known.dtype == t.dtype && known.shape == t.shape && known.role == t.role, "checkpoint",
                   "ranks describe '{}' differently ({} {} against {} {})", known.name, dtype_name(known.dtype),
                   known.shape.to_string(), dtype_name(t.dtype), t.shape.to_string());
      known.shards.push_back(shard);
    }
  }
  for (SavedTensor& t : tensors)
    std::sort(t.shards.begin(), t.shards.end(), [](const TensorShard& a, const TensorShard& b) {
      return a.first < b.first;
    });
  // Program order (a rank describes only the parameters it owns pieces of): what consolidate
  // writes follows it, as --save does.
  std::vector<size_t> order(tensors.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return param_index[a] < param_index[b]; });
  std::vector<SavedTensor> sorted;
  for (size_t i : order) sorted.push_back(std::move(tensors[i]));
  return sorted;
}

nlohmann::json tensors_json(const std::vector<SavedTensor>& tensors) {
  nlohmann::json list = nlohmann::json::array();
  for (const SavedTensor& t : tensors) {
    nlohmann::json shards = nlohmann::json::array();
    for (const TensorShard& s : t.shards) shards.push_back({s.file, s.first, s.count, s.offset});
    list.push_back({{"name", t.name}, {"param", t.param}, {"role", t.role}, {"dtype", dtype_name(t.dtype)},
                    {"shape", t.shape.dims()}, {"shards", shards}});
  }
  return list;
}

std::vector<SavedTensor> read_tensors(const nlohmann::json& v, int files) {
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  if (!v.is_array()) refuse_field("tensors", "must be an array");
  std::vector<SavedTensor> out;
  std::set<std::string> names;
  for (size_t i = 0; i < v.size(); ++i) {
    JsonFields f(v[i], fmt::format("tensors[{}]", i));
    SavedTensor t;
    t.name = f.string("name");
    if (t.name.empty() || !names.insert(t.name).second) refuse_field(f.name("name"), "is empty or names a tensor twice");
    t.param = f.string("param");
    t.role = f.string("role");
    const std::string dtype = f.string("dtype");
    try {
      t.dtype = parse_dtype(dtype);
    } catch (const Error&) {
      refuse_field(f.name("dtype"), fmt::format("names an unknown dtype '{}'", dtype));
    }
    const nlohmann::json& shape = f.at("shape");
    std::vector<int64_t> dims;
    if (!shape.is_array() || shape.size() > 8) refuse_field(f.name("shape"), "must be an array of at most 8 extents");
    for (const nlohmann::json& d : shape) {
      if (!d.is_number_integer() || d.get<int64_t>() < 0) refuse_field(f.name("shape"), "holds a non-integer extent");
      dims.push_back(d.get<int64_t>());
    }
    try {
      t.shape = Shape(dims);
    } catch (const Error&) {
      refuse_field(f.name("shape"), "has more elements than a tensor can hold");
    }
    const nlohmann::json& shards = f.at("shards");
    if (!shards.is_array() || shards.empty()) refuse_field(f.name("shards"), "must be a non-empty array");
    for (size_t k = 0; k < shards.size(); ++k) {
      const nlohmann::json& s = shards[k];
      const std::string where = fmt::format("{}[{}]", f.name("shards"), k);
      bool ok = s.is_array() && s.size() == 4;
      for (size_t j = 0; ok && j < 4; ++j) ok = s[j].is_number_integer() && s[j].get<int64_t>() >= 0;
      if (!ok) refuse_field(where, "must be [file, first, count, offset] of non-negative integers");
      const TensorShard shard{int(std::min<int64_t>(s[0].get<int64_t>(), files)), s[1].get<int64_t>(),
                              s[2].get<int64_t>(), s[3].get<uint64_t>()};
      if (shard.file >= files) refuse_field(where, fmt::format("names rank file {} of {}", s[0].get<int64_t>(), files));
      if (shard.count < 1 || shard.count > kMax - shard.first) refuse_field(where, "holds no elements");
      t.shards.push_back(shard);
    }
    f.done();
    out.push_back(std::move(t));
  }
  return out;
}

void check_shards(const std::vector<SavedTensor>& tensors, const std::vector<uint64_t>& file_bytes) {
  for (size_t i = 0; i < tensors.size(); ++i) {
    const SavedTensor& t = tensors[i];
    int64_t end = 0;  // elements [0, end) are covered by the shards so far
    for (size_t k = 0; k < t.shards.size(); ++k) {
      const TensorShard& s = t.shards[k];
      const std::string where = fmt::format("tensors[{}].shards[{}]", i, k);
      if (s.first < end)
        refuse_field(where, fmt::format("starts at element {} of '{}', inside the shard before it, which ends at {} "
                                        "(overlapping shards)", s.first, t.name, end));
      if (s.first > end)
        refuse_field(where, fmt::format("starts at element {} of '{}': elements [{}, {}) are in no shard (a gap)",
                                        s.first, t.name, end, s.first));
      end = s.first + s.count;
      const uint64_t last = s.offset + dtype_bytes(t.dtype, s.count), limit = file_bytes[size_t(s.file)];
      if (s.offset > limit || last > limit)
        refuse_field(where, fmt::format("reaches byte {} of rank file {}, which holds {} bytes of data", last, s.file,
                                        limit));
    }
    if (end != t.shape.numel())
      refuse_field(fmt::format("tensors[{}].shards", i),
                   fmt::format("end at element {} of '{}', which has {}: {} (a gap)", end, t.name, t.shape.numel(),
                               end < t.shape.numel() ? fmt::format("elements [{}, {}) are in no shard", end,
                                                                   t.shape.numel())
                                                     : "the last shard runs past its end"));
  }
}

}  // namespace memfit
