#include "train/data_loader.hpp"

#include <algorithm>
#include <numeric>

#include "core/error.hpp"
#include "train/rng.hpp"

namespace memfit {

BatchLoader::BatchLoader(const TokenData& data, int64_t begin, int64_t end, int64_t batch, int64_t seq, int64_t vocab,
                         bool shuffle, uint64_t seed, std::string split)
    : data_(data), begin_(begin), end_(end), batch_(batch), seq_(seq), vocab_(vocab), shuffle_(shuffle), seed_(seed),
      split_(std::move(split)) {
  const int64_t need = batch * seq + 1;
  MEMFIT_CHECK(end - begin >= need, "data",
               "the {} split of {} holds {} tokens, but one batch of {} x {} needs {}", split_, data.description(),
               end - begin, batch, seq, need);
  const int64_t n_batches = (end - begin - 1) / (batch * seq);
  order_.resize(size_t(n_batches));
  for (int64_t i = 0; i < n_batches; ++i) order_[size_t(i)] = begin + i * batch * seq;
  buffer_.resize(size_t(need));
  if (shuffle_) shuffle_order();
}

void BatchLoader::shuffle_order() {
  std::sort(order_.begin(), order_.end());
  Rng rng(derive_seed(seed_, "epoch") + uint64_t(epoch_));
  for (size_t i = order_.size(); i > 1; --i) std::swap(order_[i - 1], order_[rng.below(i)]);
}

void BatchLoader::reset() {
  cursor_ = 0;
  epoch_ = 0;
  if (shuffle_) shuffle_order();
}

void BatchLoader::seek(int64_t epoch, int64_t cursor) {
  MEMFIT_CHECK(epoch >= 0 && cursor >= 0 && cursor <= int64_t(order_.size()), "data",
               "cannot resume the {} data at epoch {}, batch {}: an epoch holds {} batches", split_, epoch, cursor,
               order_.size());
  epoch_ = epoch;
  if (shuffle_) shuffle_order();
  cursor_ = cursor;
}

void BatchLoader::next_rows(int32_t* tokens, int32_t* targets, int64_t first_row, int64_t rows) {
  MEMFIT_ASSERT(first_row >= 0 && rows >= 0 && first_row + rows <= batch_, "rows [{}, {}) of a batch of {}", first_row,
                first_row + rows, batch_);
  if (cursor_ == int64_t(order_.size())) {
    cursor_ = 0;
    ++epoch_;
    if (shuffle_) shuffle_order();
  }
  const int64_t start = order_[size_t(cursor_++)];
  const int64_t n = batch_ * seq_;
  data_.copy(start, n + 1, buffer_.data());
  for (int64_t i = 0; i <= n; ++i) {
    const int32_t t = buffer_[size_t(i)];
    MEMFIT_CHECK(t >= 0 && t < vocab_, "data", "token {} at position {} of {} is outside the model's vocabulary of {}",
                 t, start + i, data_.description(), vocab_);
  }
  const int64_t lo = first_row * seq_, hi = (first_row + rows) * seq_;
  std::copy(buffer_.begin() + lo, buffer_.begin() + hi, tokens);
  std::copy(buffer_.begin() + lo + 1, buffer_.begin() + hi + 1, targets);
}

void BatchLoader::next_for_rank(int32_t* tokens, int32_t* targets, int rank, int ranks) {
  MEMFIT_CHECK(ranks >= 1 && batch_ % ranks == 0, "data", "a batch of {} rows cannot be split over {} data-parallel ranks",
               batch_, ranks);
  MEMFIT_ASSERT(rank >= 0 && rank < ranks, "data-parallel rank {} of {}", rank, ranks);
  const int64_t rows = batch_ / ranks;
  next_rows(tokens, targets, int64_t(rank) * rows, rows);
}

}  // namespace memfit
