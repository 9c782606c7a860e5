// Typed reads of JSON config values shared by memfit's own keys (train/run_config.cpp) and
// DeepSpeed's (train/deepspeed_config.cpp): each throws [config] naming the key and what it
// must be, with the ranges of run_config.hpp's input rules.
#pragma once

#include <cstdint>
#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/error.hpp"
#include "train/run_config.hpp"

namespace memfit {

template <typename T>
T get_as(const nlohmann::json& j, const std::string& key) {
  try {
    return j.get<T>();
  } catch (const nlohmann::json::exception&) {
    throw Error("config", fmt::format("key '{}' has the wrong type ({})", key, j.type_name()));
  }
}

// An integer key: a JSON integer (not 2.0, not 1e5) within the range.
int64_t get_integer(const nlohmann::json& v, const std::string& key, IntRange r);
// A count DeepSpeed reads with int(): JSON integers and integral floats (5e8), within the range.
int64_t get_count(const nlohmann::json& v, const std::string& key, IntRange r);
uint64_t get_unsigned(const nlohmann::json& v, const std::string& key);
double get_real(const nlohmann::json& v, const std::string& key, RealRange r);
void refuse_unless(bool ok, const std::string& key, const std::string& why);

}  // namespace memfit
