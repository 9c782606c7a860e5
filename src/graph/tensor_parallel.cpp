#include "graph/tensor_parallel.hpp"

#include <algorithm>
#include <numeric>

#include "core/error.hpp"

namespace memfit {

void check_divisible(int64_t n, int parts, const std::string& what) {
  MEMFIT_CHECK(parts >= 1 && n % parts == 0, "policy",
               "a tensor-parallel degree of {} needs {} divisible by it (got {})", parts, what, n);
}

TensorSplit TensorParallel::rows(Shape global, std::vector<int64_t> segments) const {
  if (!on()) return {};
  return TensorSplit{TensorSplit::Axis::rows, parts, index, std::move(global), std::move(segments)};
}

TensorSplit TensorParallel::columns(Shape global) const {
  if (!on()) return {};
  return TensorSplit{TensorSplit::Axis::columns, parts, index, std::move(global), {}};
}

namespace {

std::vector<int64_t> row_segments(const TensorSplit& s) {
  if (!s.segments.empty()) return s.segments;
  return {s.global[0]};
}

int64_t row_width(const Shape& global) {
  int64_t w = 1;
  for (int d = 1; d < global.rank(); ++d) w *= global[d];
  return w;
}

}  // namespace

Shape local_shape(const TensorSplit& s) {
  if (!s.split()) return s.global;
  MEMFIT_ASSERT(s.global.rank() >= 1 && s.parts >= 1 && s.index >= 0 && s.index < s.parts, "bad tensor split of {}",
                s.global.to_string());
  std::vector<int64_t> dims = s.global.dims();
  if (s.axis == TensorSplit::Axis::rows) {
    const std::vector<int64_t> seg = row_segments(s);
    MEMFIT_ASSERT(std::accumulate(seg.begin(), seg.end(), int64_t(0)) == dims[0], "segments of {} do not sum to its rows",
                  s.global.to_string());
    for (int64_t r : seg) check_divisible(r, s.parts, "rows of a split weight");
    dims[0] /= s.parts;
  } else {
    MEMFIT_ASSERT(s.global.rank() == 2, "a column split of {} (not a matrix)", s.global.to_string());
    check_divisible(dims[1], s.parts, "columns of a split weight");
    dims[1] /= s.parts;
  }
  return Shape(dims);
}

std::vector<SliceRun> slice_runs(const TensorSplit& s, const Shape& local, int64_t first, int64_t count) {
  std::vector<SliceRun> runs;
  if (count <= 0) return runs;
  if (!s.split()) return {{first, first, count}};
  const int64_t end = first + count;
  auto clip = [&](int64_t local_begin, int64_t global_begin, int64_t n) {
    const int64_t a = std::max(local_begin, first), b = std::min(local_begin + n, end);
    if (a < b) runs.push_back({a, global_begin + (a - local_begin), b - a});
  };
  if (s.axis == TensorSplit::Axis::rows) {
    const int64_t width = row_width(s.global);
    int64_t local_row = 0, global_row = 0;
    for (int64_t seg : row_segments(s)) {
      const int64_t mine = seg / s.parts;
      clip(local_row * width, (global_row + int64_t(s.index) * mine) * width, mine * width);
      local_row += mine;
      global_row += seg;
    }
    return runs;
  }
  const int64_t cols = s.global[1], mine = local[1];
  for (int64_t r = first / mine; r < local[0] && r * mine < end; ++r)
    clip(r * mine, r * cols + int64_t(s.index) * mine, mine);
  return runs;
}

std::vector<SliceRun> slice_runs(const TensorSplit& s, const Shape& local) {
  return slice_runs(s, local, 0, local.numel());
}

}  // namespace memfit
