// Batches of (tokens, targets) from a token range, llm.c's convention: a batch reads B*T+1
// consecutive tokens; row b holds tokens [b*T, b*T + T) and its targets are the same tokens
// shifted by one. Batches follow each other in file order and wrap around at the end of the
// range; with shuffling, the order of batch positions is a seeded permutation per epoch.
// Everything is allocated at construction: next() writes into the caller's buffers (the run's
// staging for the input tensors, which it then copies in with Executor::write) and allocates
// nothing. Token ids are checked against the model's vocabulary.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "io/token_file.hpp"

namespace memfit {

class BatchLoader {
 public:
  // Throws [data] when the range holds fewer than B*T+1 tokens.
  BatchLoader(const TokenData& data, int64_t begin, int64_t end, int64_t batch, int64_t seq, int64_t vocab,
              bool shuffle, uint64_t seed, std::string split);

  // Fills tokens and targets (B*T each). Throws [data] on a token id outside the vocabulary.
  void next(int32_t* tokens, int32_t* targets) { next_rows(tokens, targets, 0, batch_); }
  // Rows [first_row, first_row + rows) of the next batch (every rank walks the same batch order).
  void next_rows(int32_t* tokens, int32_t* targets, int64_t first_row, int64_t rows);
  // Data-parallel rank `rank`'s slice of the next (global) batch: rows [rank * B/ranks,
  // (rank + 1) * B/ranks). Ranks are data-parallel ranks (Topology::data_rank()): the
  // tensor-parallel ranks of one replica read the same rows. Throws [data] when `ranks` does not
  // divide the batch.
  void next_for_rank(int32_t* tokens, int32_t* targets, int rank, int ranks);
  void reset();  // back to the first batch of the first epoch
  int64_t batches_per_epoch() const { return int64_t(order_.size()); }
  int64_t epoch() const { return epoch_; }
  int64_t cursor() const { return cursor_; }  // batches of this epoch already served
  // Continues from a position that epoch() and cursor() reported (a resumed checkpoint).
  void seek(int64_t epoch, int64_t cursor);

 private:
  void shuffle_order();

  const TokenData& data_;
  int64_t begin_, end_, batch_, seq_, vocab_;
  bool shuffle_;
  uint64_t seed_;
  std::string split_;
  std::vector<int64_t> order_;  // batch start offsets of one epoch
  std::vector<int32_t> buffer_;
  int64_t cursor_ = 0, epoch_ = 0;
};

}  // namespace memfit
