// Shapes: a short list of non-negative extents, outermost first.
// Invariant: the element count (the product of the extents) fits int64_t; a shape whose
// extents are negative or whose product overflows is refused when it is made ([shape]), so
// numel() and every byte count derived from it are exact.
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
  int64_t numel() const { return numel_; }
  // Rows when the tensor is viewed as a matrix [numel / last, last].
  int64_t rows() const;
  int64_t last() const { return dims_.empty() ? 1 : dims_.back(); }
  const std::vector<int64_t>& dims() const { return dims_; }
  std::string to_string() const;  // "(4, 256, 768)"
  bool operator==(const Shape& o) const { return dims_ == o.dims_; }

 private:
  std::vector<int64_t> dims_;
  int64_t numel_ = 1;
};

}  // namespace memfit
