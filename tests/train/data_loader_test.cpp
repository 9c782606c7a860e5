// Rows by data-parallel rank (train/data_loader.hpp): in a data 2 x tensor 2 topology the two
// tensor-parallel ranks of a replica read the same rows, and the data-parallel ranks' slices,
// put together in rank order, are the whole global batch as one loader reads it (the oracle),
// batch after batch.
#include <gtest/gtest.h>

#include <numeric>
#include <vector>

#include "core/error.hpp"
#include "graph/policy.hpp"
#include "train/data_loader.hpp"

namespace memfit {
namespace {

TEST(BatchLoader, DataParallelRanksSplitTheGlobalBatchAndTensorRanksShareTheirRows) {
  std::vector<uint16_t> tokens(10000);
  std::iota(tokens.begin(), tokens.end(), uint16_t(0));
  for (uint16_t& t : tokens) t = uint16_t(t % 251);
  const TokenData data = TokenData::from_tokens(tokens, "counting tokens");
  const int64_t B = 3, T = 8;  // rows per data-parallel rank
  const int D = 2, Tp = 2;
  BatchLoader whole(data, 0, data.size(), B * D, T, 256, false, 1, "training");
  std::vector<BatchLoader> ranks;
  for (int r = 0; r < D * Tp; ++r) ranks.emplace_back(data, 0, data.size(), B * D, T, 256, false, 1, "training");
  for (int batch = 0; batch < 3; ++batch) {
    std::vector<int32_t> all_tokens(size_t(B * D * T)), all_targets(all_tokens.size());
    whole.next(all_tokens.data(), all_targets.data());
    for (int r = 0; r < D * Tp; ++r) {
      const Topology topo{.data = D, .tensor = Tp, .rank = r};
      std::vector<int32_t> tok(size_t(B * T)), tgt(tok.size());
      ranks[size_t(r)].next_for_rank(tok.data(), tgt.data(), topo.data_rank(), topo.data);
      const auto at = all_tokens.begin() + topo.data_rank() * B * T;
      EXPECT_EQ(tok, std::vector<int32_t>(at, at + B * T)) << "rank " << r << ", batch " << batch;
      const auto tt = all_targets.begin() + topo.data_rank() * B * T;
      EXPECT_EQ(tgt, std::vector<int32_t>(tt, tt + B * T)) << "rank " << r << ", batch " << batch;
    }
  }
  std::vector<int32_t> tok(size_t(B * T)), tgt(tok.size());
  EXPECT_THROW(ranks[0].next_for_rank(tok.data(), tgt.data(), 0, 4), Error);  // 6 rows over 4 ranks
}

}  // namespace
}  // namespace memfit
