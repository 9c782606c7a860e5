// Agreement between ranks for the checkpoint protocol (see checkpoint_agree.hpp).
#include "train/checkpoint_agree.hpp"

#include <climits>
#include <exception>

#include "core/error.hpp"

namespace memfit {

Outcome outcome_of_exception(Verdict on_error) {
  try {
    throw;
  } catch (const Error& e) {
    const std::string what = e.what();
    const std::string prefix = "[" + e.piece() + "] ";
    return Outcome{on_error, what.starts_with(prefix) ? what.substr(prefix.size()) : what};
  } catch (const std::exception& e) {
    return Outcome{on_error, e.what()};
  } catch (...) {
    return Outcome{on_error, "unknown error"};
  }
}

void broadcast_string(Communicator& comm, std::string& text, int root) {
  if (comm.size() == 1) return;
  int32_t length = int32_t(text.size());
  comm.broadcast(&length, 1, DType::i32, root);
  text.resize(size_t(length));
  if (length > 0) comm.broadcast(text.data(), length, DType::u8, root);
}

Outcome agree(Communicator& comm, const Outcome& mine) {
  if (comm.size() == 1) return mine;
  int32_t worst = int32_t(mine.verdict);
  comm.all_reduce(&worst, 1, DType::i32, ReduceOp::max);
  if (worst == 0) return Outcome{};
  int32_t lowest = int32_t(mine.verdict) == worst ? -comm.rank() : INT_MIN + 1;  // max of -rank: the lowest rank
  comm.all_reduce(&lowest, 1, DType::i32, ReduceOp::max);
  Outcome all{Verdict(worst), mine.message};
  broadcast_string(comm, all.message, -lowest);
  return all;
}

}  // namespace memfit
