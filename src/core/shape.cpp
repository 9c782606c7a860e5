#include "core/shape.hpp"

#include <algorithm>

#include "core/error.hpp"

namespace memfit {

Shape::Shape(std::initializer_list<int64_t> dims) : Shape(std::vector<int64_t>(dims)) {}

Shape::Shape(std::vector<int64_t> dims) : dims_(std::move(dims)) {
  for (int64_t d : dims_) MEMFIT_CHECK(d >= 0, "shape", "shape {} has a negative extent", to_string());
  if (std::find(dims_.begin(), dims_.end(), 0) != dims_.end()) {
    numel_ = 0;
    return;
  }
  int64_t n = 1;
  for (int64_t d : dims_)
    if (__builtin_mul_overflow(n, d, &n)) [[unlikely]]
      throw Error("shape", fmt::format("shape {} has more than 2^63 elements", to_string()));
  numel_ = n;
}

int64_t Shape::rows() const { return last() == 0 ? 0 : numel() / last(); }

std::string Shape::to_string() const {
  std::string s = "(";
  for (size_t i = 0; i < dims_.size(); ++i) s += (i ? ", " : "") + std::to_string(dims_[i]);
  return s + ")";
}

}  // namespace memfit
