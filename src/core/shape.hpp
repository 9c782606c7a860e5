// Shapes: a short list of non-negative extents, outermost first.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

namespace memfit {

class Shape {
 public:
  Shape() = default;
  Shape(std::initializer_list<int64_t> dims);
  explicit Shape(std::vector<int64_t> dims);

  int rank() const { return int(dims_.size()); }
  int64_t operator[](int i) const { return dims_[size_t(i)]; }
  int64_t numel() const;
  // Rows when the tensor is viewed as a matrix [numel / last, last].
  int64_t rows() const;
  int64_t last() const { return dims_.empty() ? 1 : dims_.back(); }
  const std::vector<int64_t>& dims() const { return dims_; }
  std::string to_string() const;  // "(4, 256, 768)"
  bool operator==(const Shape&) const = default;

 private:
  std::vector<int64_t> dims_;
};

}  // namespace memfit
