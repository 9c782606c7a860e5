// Where each global tensor's elements sit in a rank's checkpointed roots (see
// checkpoint_layout.hpp). The ZeRO facts used (graph/zero.cpp): a parameter keeps its value
// tensor, now a view into a bucket (stages 0-2: the whole bucket, persistent; stage 3: a
// transient gather buffer, with the persistent piece in `value_shard`); masters and optimizer
// state keep their ids and names but shrink to the piece [shard_offset, + shard_numel).
#include "train/checkpoint_layout.hpp"

#include <algorithm>
#include <limits>
#include <map>
#include <set>

#include <nlohmann/json.hpp>

#include "core/error.hpp"
#include "graph/optimizer.hpp"
#include "train/checkpoint_fields.hpp"
#include "train/checkpoint_rank_file.hpp"

namespace memfit {

namespace {

int64_t element_offset(const TensorDesc& t) { return int64_t(t.view_offset * 8 / uint64_t(dtype_bits(t.dtype))); }

struct PieceSink {
  const Program& p;
  int rank;
  std::vector<LocalPiece> out;

  // Tensor parallelism: this rank's index in its tensor group and the group's size (read from
  // the split parameters, which carry them; 1 when nothing is split).
  int tp_index = 0, tp_parts = 1;

  // Elements [first, first + count) of tensor `id` (in the rank's whole parameter, before any
  // tensor-parallel split), held from element `skip` of `holder`. A split parameter's elements
  // map onto the one-rank tensor run by run (graph/tensor_parallel.hpp).
  void add(const ParamEntry& e, std::string role, TensorId id, const Shape& shape, TensorId holder, int64_t first,
           int64_t count, bool described, int64_t skip = 0) {
    if (count <= 0) return;
    // A parameter replicated over the tensor group is described by its member 0.
    described = described && (e.split.split() || tp_index == 0);
    if (!e.split.split()) return add_run(e, role, id, shape, holder, first, count, described, skip);
    MEMFIT_ASSERT(shape == p.tensor(e.value).shape, "{} of {} is not shaped as its parameter", role, e.name);
    for (const SliceRun& r : slice_runs(e.split, shape, first, count))
      add_run(e, role, id, e.split.global, holder, r.global, r.count, described, skip + (r.local - first));
  }

  void add_run(const ParamEntry& e, const std::string& role, TensorId id, const Shape& global, TensorId holder,
               int64_t first, int64_t count, bool described, int64_t skip) {
    const int64_t param_index = &e - p.params().data();
    const TensorDesc& t = p.tensor(holder);
    LocalPiece piece;
    piece.tensor = SavedTensor{p.tensor(id).name, e.name, role, t.dtype, global, {}};
    piece.root = p.root_of(holder);
    piece.at = (t.is_view() ? element_offset(t) : 0) + skip;
    piece.first = first;
    piece.count = count;
    piece.described = described;
    piece.param_index = param_index;
    out.push_back(std::move(piece));
  }

  // A tensor every rank holds whole (stage 0, frozen values below stage 3, quantised storage):
  // rank 0's copy is the one described (under tensor parallelism, data rank 0's of each slice).
  void whole(const ParamEntry& e, std::string role, TensorId id) {
    add(e, std::move(role), id, p.tensor(id).shape, id, 0, p.tensor(id).numel(), rank / tp_parts == 0);
  }

  void value(const ParamEntry& e) {
    const TensorDesc& v = p.tensor(e.value);
    if (e.value_shard != kNoTensor)  // stage 3: only the piece persists
      return add(e, "value", e.value, v.shape, e.value_shard, e.shard_offset, e.shard_numel, true);
    if (p.tensor(p.root_of(e.value)).lifetime != Lifetime::persistent) return;  // stage 3, no piece here
    if (e.whole_state()) return whole(e, "value", e.value);
    // Stages 1-2: every rank holds the whole bucket; each piece is described by its owner.
    const int64_t a = e.shard_offset, b = e.shard_offset + e.shard_numel;
    add(e, "value", e.value, v.shape, e.value, 0, a, false);
    add(e, "value", e.value, v.shape, e.value, a, b - a, true, a);
    add(e, "value", e.value, v.shape, e.value, b, v.numel() - b, false, b);
  }

  void optimizer_tensors(const ParamEntry& e) {
    if (e.value == kNoTensor) return;  // stored only quantised: frozen, nothing to update
    const Shape& shape = p.tensor(e.value).shape;
    const bool q8 = e.state.size() == 4;
    MEMFIT_CHECK(!q8 || !e.split.split(), "checkpoint",
                 "8-bit optimizer state of the tensor-parallel slice of '{}': its blocks are not the one-rank tensor's, "
                 "so it cannot be described globally (checkpoint tensor-parallel runs with --optimizer adamw)", e.name);
    auto sharded = [&](const std::string& role, TensorId id, bool blocks) {
      if (e.whole_state()) return whole(e, role, id);
      if (!blocks) return add(e, role, id, shape, id, e.shard_offset, e.shard_numel, true);
      const Shape global{(shape.numel() + kQuantBlock - 1) / kQuantBlock};
      MEMFIT_CHECK(e.shard_offset % kQuantBlock == 0, "checkpoint",
                   "the 8-bit state of '{}' starts at element {}, inside a block of {}", e.name, e.shard_offset,
                   kQuantBlock);
      add(e, role, id, global, id, e.shard_offset / kQuantBlock, p.tensor(id).numel(), true);
    };
    if (e.master != kNoTensor) sharded("master", e.master, false);
    for (size_t s = 0; s < e.state.size(); ++s) {
      const std::string& name = p.tensor(e.state[s]).name;
      const std::string suffix = "." + e.name;
      const std::string role = name.ends_with(suffix) ? name.substr(0, name.size() - suffix.size())
                                                      : fmt::format("state{}", s);
      sharded(role, e.state[s], q8 && s >= 2);
    }
  }
};

}  // namespace

std::vector<LocalPiece> local_pieces(const Program& p, int rank) {
  PieceSink sink{p, rank, {}};
  for (const ParamEntry& e : p.params())
    if (e.split.split()) sink.tp_index = e.split.index, sink.tp_parts = e.split.parts;
  for (const ParamEntry& e : p.params()) {
    for (size_t k = 0; k < e.storage.size(); ++k) {
      const StoredTensor& s = e.storage[k];
      if (s.role == ParamRole::value) continue;
      const std::string role(param_role_name(s.role));
      if (e.storage_shard.empty()) {
        sink.whole(e, role, s.id);
        continue;
      }
      // ZeRO-3: this rank's bytes of the stored tensor, in its elements (none straddles ranks).
      const ParamEntry::StoragePiece& piece = e.storage_shard[k];
      const int64_t bits = dtype_bits(p.tensor(s.id).dtype);
      if (piece.view != kNoTensor)
        sink.add(e, role, s.id, p.tensor(s.id).shape, piece.view, piece.first * 8 / bits, piece.bytes * 8 / bits, true);
    }
    if (e.value != kNoTensor) sink.value(e);
    sink.optimizer_tensors(e);
  }
  std::set<TensorId> covered;
  for (const LocalPiece& piece : sink.out) covered.insert(piece.root);
  for (TensorId id : checkpointed_tensors(p))
    MEMFIT_CHECK(covered.count(id), "checkpoint",
                 "tensor '{}' is checkpointed but belongs to no parameter: it cannot be described globally",
                 p.tensor(id).name);
  return sink.out;
}

std::string describe_pieces(const Program& p, int rank, const std::vector<uint64_t>& root_offsets) {
  const std::vector<TensorId> roots = checkpointed_tensors(p);
  MEMFIT_ASSERT(roots.size() == root_offsets.size(), "{} roots, {} offsets", roots.size(), root_offsets.size());
  std::map<TensorId, uint64_t> offset_of;
  for (size_t i = 0; i < roots.size(); ++i) offset_of[roots[i]] = root_offsets[i];
  nlohmann::json list = nlohmann::json::array();
  for (const LocalPiece& piece : local_pieces(p, rank)) {
    if (!piece.described) continue;
    const SavedTensor& t = piece.tensor;
    list.push_back({t.name, t.param, t.role, dtype_name(t.dtype), t.shape.dims(), piece.first, piece.count,
                    offset_of.at(piece.root) + dtype_bytes(t.dtype, piece.at), piece.param_index});
  }
  return list.dump();
}

}  // namespace memfit
