// Field-by-field JSON reading for checkpoint files (see checkpoint_fields.hpp).
#include "train/checkpoint_fields.hpp"

#include <cmath>
#include <limits>

#include "core/error.hpp"

namespace memfit {

void refuse_field(const std::string& field, const std::string& why) {
  throw Error("checkpoint", fmt::format("field '{}' {}", field, why));
}

std::string describe_json(const nlohmann::json& v) {
  if (!v.is_primitive()) return std::string("a JSON ") + v.type_name();
  std::string text = v.dump();
  if (text.size() > 40) text = text.substr(0, 37) + "...";
  return text;
}

JsonFields::JsonFields(const nlohmann::json& object, std::string path) : object_(object), path_(std::move(path)) {
  if (!object_.is_object())
    refuse_field(path_.empty() ? "(top level)" : path_, "must be a JSON object, not " + describe_json(object_));
}

std::string JsonFields::name(const std::string& key) const { return path_.empty() ? key : path_ + "." + key; }

const nlohmann::json& JsonFields::at(const std::string& key) {
  const auto it = object_.find(key);
  if (it == object_.end()) refuse_field(name(key), "is missing");
  asked_.insert(key);
  return *it;
}

int64_t JsonFields::integer(const std::string& key, int64_t lo, int64_t hi) {
  const nlohmann::json& v = at(key);
  if (!v.is_number_integer()) refuse_field(name(key), fmt::format("must be an integer, not {}", describe_json(v)));
  const bool big = v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(std::numeric_limits<int64_t>::max());
  const int64_t x = big ? 0 : v.get<int64_t>();
  if (big || x < lo || x > hi) refuse_field(name(key), fmt::format("is {}, outside [{}, {}]", describe_json(v), lo, hi));
  return x;
}

double JsonFields::number(const std::string& key, double lo, bool lo_open) {
  const nlohmann::json& v = at(key);
  if (!v.is_number()) refuse_field(name(key), fmt::format("must be a number, not {}", describe_json(v)));
  const double x = v.get<double>();
  if (!std::isfinite(x) || x < lo || (lo_open && x == lo))
    refuse_field(name(key), fmt::format("is {}; it must be finite and {} {}", describe_json(v), lo_open ? ">" : ">=", lo));
  return x;
}

std::string JsonFields::string(const std::string& key) {
  const nlohmann::json& v = at(key);
  if (!v.is_string()) refuse_field(name(key), fmt::format("must be a string, not {}", describe_json(v)));
  return v.get<std::string>();
}

void JsonFields::done() const {
  for (const auto& [key, value] : object_.items())
    if (!asked_.count(key)) refuse_field(name(key), "is not a field this build knows");
}

}  // namespace memfit
