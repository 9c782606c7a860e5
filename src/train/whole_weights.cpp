// Gathering whole parameters (see whole_weights.hpp). The subtle point is the layout: a
// parameter is a view into its bucket's root (the full bucket at stages 1 and 2, the forward
// gather buffer at stage 3) at the same element offset on every rank, and rank r's piece of
// it is elements [shard_offset, shard_offset + shard_numel) of the parameter, which fall
// inside the bucket's r-th equal shard. So each rank writes its pieces at their bucket
// positions into a shard-sized buffer, and one all-gather of equal counts rebuilds the bucket.
#include "train/whole_weights.hpp"

#include <map>

#include "core/error.hpp"
#include "graph/tensor_parallel.hpp"
#include "train/master_weights.hpp"

namespace memfit {

namespace {

// This rank's piece of e as fp32: its master piece, or (stage 3 without masters) its shard
// of the parameter widened, or (stages 1 and 2 without masters) its slice of the whole value.
void read_piece(const Executor& ex, const ParamEntry& e, std::span<float> out, TensorStaging& staging) {
  if (e.master != kNoTensor) return ex.read_as<float>(e.master, 0, out);
  if (e.value_shard != kNoTensor) return read_fp32(ex, e.value_shard, 0, out, staging.raw());
  read_fp32(ex, e.value, e.shard_offset, out, staging.raw());
}

}  // namespace

std::vector<std::vector<float>> gather_whole_parameters(const Executor& ex, Communicator& comm,
                                                        TensorStaging& staging) {
  const Program& p = ex.program();
  const int world = comm.size(), rank = comm.rank();
  std::vector<std::vector<float>> out(p.params().size());
  std::map<TensorId, std::vector<size_t>> buckets;  // bucket root -> parameter indices
  for (size_t i = 0; i < p.params().size(); ++i) {
    const ParamEntry& e = p.params()[i];
    if (e.value == kNoTensor) continue;  // stored only quantised, not as values: a QLoRA run saves its adapter
    if (e.whole_state() && e.value_shard == kNoTensor) {
      out[i].resize(size_t(p.tensor(e.value).numel()));
      load_parameter_range(ex, e, 0, out[i], staging);
    }
    else buckets[p.root_of(e.value)].push_back(i);
  }
  for (const auto& [root, members] : buckets) {
    const int64_t n = p.tensor(root).numel(), shard = n / world;
    MEMFIT_CHECK(n % world == 0, "train", "bucket '{}' of {} elements does not split into {} shards",
                 p.tensor(root).name, n, world);
    std::vector<float> mine(size_t(shard), 0.0f);
    std::vector<float> whole(static_cast<size_t>(n));
    std::vector<int64_t> offset(members.size());
    for (size_t j = 0; j < members.size(); ++j) {
      const ParamEntry& e = p.params()[members[j]];
      const TensorDesc& v = p.tensor(e.value);
      offset[j] = int64_t(v.view_offset / dtype_bytes(v.dtype, 1));
      if (e.shard_numel <= 0) continue;
      const int64_t at = offset[j] + e.shard_offset - int64_t(rank) * shard;
      MEMFIT_CHECK(at >= 0 && at + e.shard_numel <= shard, "train",
                   "the piece of '{}' on rank {} lies outside the rank's shard of its bucket", e.name, rank);
      read_piece(ex, e, std::span<float>(mine).subspan(size_t(at), size_t(e.shard_numel)), staging);
    }
    comm.all_gather(mine.data(), whole.data(), shard, DType::f32);
    for (size_t j = 0; j < members.size(); ++j) {
      const int64_t numel = p.tensor(p.params()[members[j]].value).numel();
      out[members[j]].assign(whole.begin() + offset[j], whole.begin() + offset[j] + numel);
    }
  }
  return out;
}

std::vector<std::vector<float>> gather_tensor_parallel_trainable(const Executor& ex, Communicator& tensor_group,
                                                                 TensorStaging& staging,
                                                                 const std::vector<std::vector<float>>* slices) {
  const Program& p = ex.program();
  std::vector<std::vector<float>> out(p.params().size());
  for (size_t i = 0; i < p.params().size(); ++i) {
    const ParamEntry& e = p.params()[i];
    if (!e.trainable || e.value == kNoTensor) continue;
    const Shape local = p.tensor(e.value).shape;
    std::vector<float> mine(size_t(local.numel()));
    if (slices) {
      MEMFIT_CHECK((*slices)[i].size() == mine.size(), "train", "'{}': {} gathered elements for a slice of {}", e.name,
                   (*slices)[i].size(), mine.size());
      mine = (*slices)[i];
    } else {
      load_parameter_range(ex, e, 0, mine, staging);
    }
    if (!e.split.split()) {
      out[i] = std::move(mine);
      continue;
    }
    out[i].assign(size_t(e.split.global.numel()), 0.0f);
    for (const SliceRun& r : slice_runs(e.split, local))
      std::copy_n(mine.begin() + r.local, r.count, out[i].begin() + r.global);
    tensor_group.all_reduce(out[i].data(), int64_t(out[i].size()), DType::f32, ReduceOp::sum);
  }
  return out;
}

}  // namespace memfit
