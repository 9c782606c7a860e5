#include "kernels/quant_map.hpp"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/error.hpp"

namespace memfit {

QuantMap make_dynamic_map(bool is_signed) {
  constexpr int kDecades = 7;  // 10^-6 .. 10^0
  std::vector<double> values;
  for (int e = 0; e < kDecades; ++e) {
    const int n = is_signed ? 1 << e : 1 << (e + 1);
    const double decade = std::pow(10.0, double(e - (kDecades - 1)));
    for (int j = 0; j < n; ++j) {
      const double fraction = 0.1 + 0.9 * (double(j) + 0.5) / double(n);
      values.push_back(decade * fraction);
      if (is_signed) values.push_back(-decade * fraction);
    }
  }
  values.push_back(0.0);
  values.push_back(1.0);
  MEMFIT_ASSERT(values.size() == size_t(kQuantMapSize), "dynamic map has {} entries", values.size());
  std::sort(values.begin(), values.end());
  QuantMap map{};
  for (int i = 0; i < kQuantMapSize; ++i) map[size_t(i)] = float(values[size_t(i)]);
  return map;
}

const QuantMap& dynamic_map_signed() {
  static const QuantMap map = make_dynamic_map(true);
  return map;
}

const QuantMap& dynamic_map_unsigned() {
  static const QuantMap map = make_dynamic_map(false);
  return map;
}

int zero_code(const QuantMap& map) {
  const auto it = std::find(map.begin(), map.end(), 0.0f);
  MEMFIT_ASSERT(it != map.end(), "quantization map without a zero entry");
  return int(it - map.begin());
}

}  // namespace memfit
