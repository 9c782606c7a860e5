// Agreement between ranks for the checkpoint protocol (see checkpoint_agree.hpp).
#include "train/checkpoint_agree.hpp"

#include <algorithm>
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

std::vector<std::string> all_gather_strings(Communicator& comm, const std::string& mine) {
  const size_t world = size_t(comm.size());
  if (world == 1) return {mine};
  std::vector<int64_t> lengths(world);
  const int64_t length = int64_t(mine.size());
  comm.all_gather(&length, lengths.data(), int64_t(sizeof length), DType::u8);
  // Equal counts: each rank's text padded to the longest.
  const int64_t longest = *std::max_element(lengths.begin(), lengths.end());
  std::string padded = mine;
  padded.resize(size_t(longest));
  std::string all(world * size_t(longest), '\0');
  if (longest > 0) comm.all_gather(padded.data(), all.data(), longest, DType::u8);
  std::vector<std::string> out(world);
  for (size_t r = 0; r < world; ++r) out[r] = all.substr(r * size_t(longest), size_t(lengths[r]));
  return out;
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
