#include "train/config_values.hpp"

#include <cmath>

namespace memfit {

using nlohmann::json;

int64_t get_integer(const json& v, const std::string& key, IntRange r) {
  const bool too_big = v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(INT64_MAX);
  MEMFIT_CHECK(v.is_number_integer() && !too_big, "config", "key '{}' must be {} (got {})", key, describe(r),
               v.dump());
  return require_in(key, v.get<int64_t>(), r);
}

int64_t get_count(const json& v, const std::string& key, IntRange r) {
  if (v.is_number_integer()) return get_integer(v, key, r);
  MEMFIT_CHECK(v.is_number_float() && std::isfinite(v.get<double>()) && v.get<double>() == std::floor(v.get<double>()) &&
                   std::fabs(v.get<double>()) < 9e18,
               "config", "key '{}' must be {} (got {})", key, describe(r), v.dump());
  return require_in(key, int64_t(v.get<double>()), r);
}

uint64_t get_unsigned(const json& v, const std::string& key) {
  MEMFIT_CHECK(v.is_number_unsigned() || (v.is_number_integer() && v.get<int64_t>() >= 0), "config",
               "key '{}' must be an integer in [0, 2^64) (got {})", key, v.dump());
  return v.get<uint64_t>();
}

double get_real(const json& v, const std::string& key, RealRange r) {
  MEMFIT_CHECK(v.is_number(), "config", "key '{}' must be {} (got {})", key, describe(r), v.dump());
  return require_in(key, v.get<double>(), r);
}

void refuse_unless(bool ok, const std::string& key, const std::string& why) {
  MEMFIT_CHECK(ok, "config", "key '{}': {}", key, why);
}

}  // namespace memfit
