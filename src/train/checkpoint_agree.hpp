// Agreement between ranks for the checkpoint protocol. Each rank does its local part of a
// phase inside attempt(), which turns any exception into a verdict and a message instead of
// letting it escape between collectives; agree() then tells every rank the worst verdict and
// the message of the lowest rank that has it. Invariant: every rank runs the same sequence
// of collectives whatever fails where, so nobody is left waiting in one.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "dist/communicator.hpp"

namespace memfit {

enum class Verdict : int32_t {
  ok = 0,
  damaged = 1,       // a file is unfinished, truncated, edited or corrupt: an older checkpoint may do
  incompatible = 2,  // the checkpoint is sound but belongs to another kind of run
  failed = 3,        // an I/O error or anything unexpected
};

struct Outcome {
  Verdict verdict = Verdict::ok;
  std::string message;  // one line, without the "[checkpoint] " prefix
  bool ok() const { return verdict == Verdict::ok; }
};

// Runs f(); an exception becomes {on_error, its message} (memfit::Error without its piece).
template <typename F>
Outcome attempt(Verdict on_error, F&& f);

Outcome outcome_of_exception(Verdict on_error);  // call inside a catch block

// Collective: the worst verdict of all ranks and the lowest such rank's message.
Outcome agree(Communicator& comm, const Outcome& mine);

// Collective: `text` of rank `root` on every rank.
void broadcast_string(Communicator& comm, std::string& text, int root);

// Collective: every rank's `mine`, indexed by rank.
std::vector<std::string> all_gather_strings(Communicator& comm, const std::string& mine);

template <typename F>
Outcome attempt(Verdict on_error, F&& f) {
  try {
    f();
    return Outcome{};
  } catch (...) {
    return outcome_of_exception(on_error);
  }
}

}  // namespace memfit
