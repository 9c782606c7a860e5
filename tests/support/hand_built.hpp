// Helpers for tests that build small programs by hand and check refusals: one plain op
// appended to a program, and the message of the memfit::Error a call throws.
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/error.hpp"
#include "graph/program.hpp"

namespace memfit::test {

// Appends an op that overwrites each output; an all_reduce names the data group of 2 ranks.
inline void add_plain_op(Program& p, OpKind kind, const std::string& name, std::vector<TensorId> in,
                         std::vector<TensorId> out) {
  Op o;
  o.kind = kind;
  o.name = name;
  o.inputs = std::move(in);
  o.outputs = std::move(out);
  o.modes.assign(o.outputs.size(), WriteMode::overwrite);
  if (kind == OpKind::all_reduce) o.attrs = CollectiveAttrs{CommGroup::data, 2};
  p.add_op(std::move(o));
}

// The message of the memfit::Error `fn` throws; fails the test when it throws none.
template <class Fn>
std::string error_of(Fn&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "no error thrown";
  return {};
}

}  // namespace memfit::test
