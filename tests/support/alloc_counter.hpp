// Counts heap allocations made while counting is on, by interposing malloc and friends in the
// test executable (every shared library's calls resolve to these). Allocations made inside a
// LibraryCallScope (oneDNN's execute path) are counted apart, with the bytes still
// outstanding when counting stops, so a test can require memfit's own count to be zero and
// the library's to be freed before return.
#pragma once

#include <cstdint>

namespace memfit::test {

struct AllocCounts {
  int64_t memfit_allocations = 0;   // outside any library call
  int64_t library_allocations = 0;  // inside a LibraryCallScope
  int64_t library_bytes_outstanding = 0;  // allocated in library calls and not yet freed
  int64_t library_max_bytes = 0;    // largest single library allocation
};

void alloc_counter_start();
AllocCounts alloc_counter_stop();

}  // namespace memfit::test
