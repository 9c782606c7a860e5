// Field-by-field reading of the JSON in checkpoint files (the manifest, a rank file's
// header): each field is asked for by name with its type and range, errors name the field by
// its JSON path ("field 'loader.epoch' is ..."), and done() refuses any field nobody asked
// for. Invariant: a value is returned only when it has the type and range asked for.
#pragma once

#include <cstdint>
#include <set>
#include <string>

#include <nlohmann/json.hpp>

namespace memfit {

// Throws [checkpoint] "field 'F' WHY".
[[noreturn]] void refuse_field(const std::string& field, const std::string& why);

// A JSON value in an error message: scalars as written (cut to 40 characters), containers by type.
std::string describe_json(const nlohmann::json& v);

class JsonFields {
 public:
  // Throws unless `object` is a JSON object; `path` prefixes every field name ("" at the top).
  JsonFields(const nlohmann::json& object, std::string path);
  std::string name(const std::string& key) const;
  const nlohmann::json& at(const std::string& key);  // throws when missing
  int64_t integer(const std::string& key, int64_t lo, int64_t hi);  // a JSON integer in [lo, hi]
  double number(const std::string& key, double lo, bool lo_open);   // finite, >= lo (> lo when open)
  std::string string(const std::string& key);
  void done() const;  // throws on a field that was not asked for

 private:
  const nlohmann::json& object_;
  std::string path_;
  std::set<std::string> asked_;
};

}  // namespace memfit
