// Liveness: the ops during which each tensor's bytes must hold its value.
// - Views fold into their root: a use of a view is a use of its root.
// - A transient root lives from the first op that touches it (input, output or workspace) to
//   the last one, inclusive.
// - A persistent root lives through the whole program.
// - A section that repeats (gradient accumulation) is a loop: a value that crosses its
//   boundary (produced before and read inside, or produced inside and read after) lives
//   through the entire section, since every iteration needs it.
#pragma once

#include <vector>

#include "graph/program.hpp"

namespace memfit {

struct Interval {
  int first = -1, last = -1;  // op indices, inclusive; first == -1: never used
  bool used() const { return first >= 0; }
  bool contains(int op) const { return first <= op && op <= last; }
};

// One entry per tensor id; views get their root's interval.
std::vector<Interval> compute_liveness(const Program& program);

}  // namespace memfit
