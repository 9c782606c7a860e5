// The ZeRO pass (see zero.hpp). It works in three moves on the finished program: re-home
// parameters and gradients into flat bucket roots (existing tensors become views, so every
// op that names them is untouched); shrink master weights and optimizer state to this rank's
// pieces (the tensors keep their ids, only their shapes change); then rebuild the op list,
// inserting collectives and re-pointing the optimizer ops at the pieces.
#include "graph/zero.hpp"

#include <algorithm>
#include <map>
#include <optional>

#include <fmt/format.h>

#include "core/error.hpp"
#include "graph/optimizer.hpp"
#include "graph/precision.hpp"
#include "graph/training_program.hpp"
#include "graph/zero_qgz.hpp"
#include "graph/zero_hpz.hpp"
#include "graph/zero_parts.hpp"
#include "graph/zero_quant.hpp"

namespace memfit {

namespace {

struct ZeroPass {
  Program& p;
  const Policy& policy;
  ZeroLayout L;
  // world and rank are the data group's (ZeRO shards over the ranks holding the same
  // tensor-parallel slice); everywhere is the world's size (the overflow flag's group).
  int stage = 0, world = 1, rank = 0, everywhere = 1, micro_repeat = 1;
  bool qwz = false;  // stage 3's gathers in int8 (ZeRO++ qwZ, zero_quant.hpp)
  int hpz = 1;       // > 1: ZeRO++ hpZ's partition size (zero_hpz.hpp); the backward gathers over it

  std::vector<TensorId> param_root{}, grad_root{}, grad_shard_root{};  // per bucket
  // Stage 3, per bucket: transient gather buffers of the forward, backward (and recompute)
  // and validation passes; param_root is then the persistent shard.
  std::vector<TensorId> gather_fwd{}, gather_bwd{}, gather_eval{};
  std::map<TensorId, TensorId> bwd_view{}, eval_view{};  // parameter value -> its view in those buffers
  // qwZ, per gather (numbered as gather_op numbers them): its wire and decoder, emitted when the
  // gather is, and the gathers to decode before each old op (the bucket's first use in the pass).
  std::vector<QwzGather> qwz_of{};
  std::vector<std::vector<size_t>> arrivals_before{};
  std::vector<HpzCopy> hpz_of{};  // hpZ, per bucket: its secondary and the copy into it (or none)
  // Per parameter (index into params()).
  std::vector<int64_t> piece_first{}, piece_count{};
  std::vector<TensorId> value_piece{}, grad_piece{};
  std::vector<int> bucket_of{};
  std::map<TensorId, int> param_of_grad{}, param_of_target{};
  // qgZ (zero_qgz.hpp): a bucket's last decode (and accumulation) waits in qgz_later for the
  // next bucket's reduction, so its last all-to-all overlaps that bucket's backward.
  bool qgz = false;
  int qgz_bits = 4;
  Topology topo{};
  std::vector<Op> qgz_later{};

  // A collective over the data group; over the world with `everywhere_max` (an all-reduce with
  // max: the fp16 overflow flag, which every rank must agree on whatever slice it holds).
  Op collective(OpKind kind, std::string name, std::vector<TensorId> in, std::vector<TensorId> out, Phase phase,
                int layer, bool everywhere_max = false) const {
    Op op;
    op.kind = kind;
    op.phase = phase;
    op.name = std::move(name);
    op.layer = layer;
    op.inputs = std::move(in);
    op.outputs = std::move(out);
    op.modes.assign(op.outputs.size(), WriteMode::overwrite);
    const CollectiveAttrs attrs = everywhere_max ? CollectiveAttrs{CommGroup::world, everywhere, true}
                                                 : CollectiveAttrs{CommGroup::data, world, false};
    op.attrs = attrs;
    const double full = double(p.tensor(kind == OpKind::reduce_scatter ? op.inputs[0] : op.outputs[0]).bytes());
    op.comm_bytes = ring_bytes(full, attrs.size, kind == OpKind::all_reduce ? 2.0 : 1.0);
    return op;
  }

  // Tensor id becomes the view at byte `at` of a bucket root (a bucket of bytes, ZeroBucket::bytes,
  // holds tensors of any dtype).
  void make_view(TensorId id, TensorId root, uint64_t at) {
    TensorDesc& t = p.tensor(id);
    MEMFIT_ASSERT(!t.is_view(), "tensor {} is already a view", t.name);
    const TensorDesc& r = p.tensor(root);
    MEMFIT_ASSERT(t.dtype == r.dtype || r.dtype == DType::u8, "tensor {} ({}) in bucket {} ({})", t.name,
                  dtype_name(t.dtype), r.name, dtype_name(r.dtype));
    t.view_of = root;
    t.view_offset = at;
    t.lifetime = r.lifetime;
  }

  TensorId add_root(std::string name, int64_t elements, DType dtype, Category cat, Lifetime life, int layer) {
    TensorDesc d;
    d.name = std::move(name);
    d.shape = Shape{elements};
    d.dtype = dtype;
    d.category = cat;
    d.lifetime = life;
    d.layer = layer;
    return p.add_tensor(std::move(d));
  }

  void build_buckets() {
    const size_t n = p.params().size();
    piece_first.assign(n, 0);
    piece_count.assign(n, -1);
    value_piece.assign(n, kNoTensor);
    grad_piece.assign(n, kNoTensor);
    bucket_of.assign(n, -1);
    // Stage 3: a bucket's backward (or eval) gather buffer exists only where that pass reads
    // one of its values (a frozen bucket may be read by the forward only).
    const bool has_eval = p.find_section(SectionKind::eval) != nullptr;
    const std::vector<int> fwd_first = stage == 3 ? first_uses(p.ops(), 0) : std::vector<int>();
    const std::vector<int> bwd_first = stage == 3 ? first_uses(p.ops(), 1) : std::vector<int>();
    const std::vector<int> eval_first = stage == 3 && has_eval ? first_uses(p.ops(), 2) : std::vector<int>();
    for (size_t bi = 0; bi < L.buckets.size(); ++bi) {
      const ZeroBucket& b = L.buckets[bi];
      const ParamEntry& first = p.params()[size_t(b.params[0])];
      const DType pdt = b.bytes ? DType::u8 : p.tensor(first.value).dtype;
      if (stage == 3) {
        param_root.push_back(add_root("zero.params." + b.tag + ".shard", L.shard(b), pdt, Category::parameters,
                                      Lifetime::persistent, b.layer));
        // A bucket the forward never reads (the trainable rest of the outer parameters when the
        // embedding is frozen: lm_head, read by the classifier inside the backward) is gathered
        // by the backward alone, into the buffer its values live in.
        const bool backward_only = fwd_first[bi] < 0 && bwd_first[bi] >= 0 && hpz <= 1;
        gather_fwd.push_back(add_root("zero.gather." + b.tag + (backward_only ? ".backward" : ".forward"), b.elements,
                                      pdt, Category::communication, Lifetime::transient, b.layer));
        TensorId bwd = backward_only ? gather_fwd.back() : kNoTensor;
        if (!backward_only && bwd_first[bi] >= 0)
          bwd = add_root("zero.gather." + b.tag + ".backward", b.elements, pdt, Category::communication,
                         Lifetime::transient, b.layer);
        gather_bwd.push_back(bwd);
        if (hpz > 1)
          hpz_of.push_back(gather_bwd.back() == kNoTensor ? HpzCopy{} : hpz_copy(p, L, bi, gather_fwd.back(), hpz));
        if (has_eval)
          gather_eval.push_back(eval_first[bi] < 0 ? kNoTensor
                                                   : add_root("zero.gather." + b.tag + ".eval", b.elements, pdt,
                                                              Category::communication, Lifetime::transient, b.layer));
      } else {
        param_root.push_back(add_root("zero.params." + b.tag, b.elements, pdt, Category::parameters,
                                      Lifetime::persistent, b.layer));
      }
      if (b.frozen) {  // values only: no gradient bucket, no gradient shard
        grad_root.push_back(kNoTensor);
        if (stage >= 2) grad_shard_root.push_back(kNoTensor);
        for (size_t j = 0; j < b.params.size(); ++j) home_value(bi, j);
        continue;
      }
      const DType gdt = p.tensor(first.grad).dtype;
      const Lifetime glife = stage >= 2 ? Lifetime::transient : p.tensor(first.grad).lifetime;
      grad_root.push_back(add_root("zero.grads." + b.tag, b.elements, gdt, Category::gradients, glife, b.layer));
      // With one micro-step the shard only carries the reduce-scatter's result to the update of
      // the same step, so it is step-transient: born in the backward, dead after the optimizer.
      // (Persistent, it would sit in every peak and make stage 2 cost more than stage 1, whose
      // full-size gradients are transient.) Accumulation needs it across micro-steps.
      if (stage >= 2)
        grad_shard_root.push_back(add_root("zero.grad_shard." + b.tag, L.shard(b), gdt, Category::gradients,
                                           policy.grad_accum == 1 ? Lifetime::transient : Lifetime::persistent,
                                           b.layer));
      for (size_t j = 0; j < b.params.size(); ++j) {
        const int pi = b.params[j];
        const ParamEntry& e = p.params()[size_t(pi)];
        home_value(bi, j);
        make_view(e.grad, grad_root.back(), dtype_bytes(gdt, b.offsets[j]));
        param_of_grad[e.grad] = pi;
      }
    }
  }

  // The j-th parameter of bucket bi becomes a view into the bucket (stage 3: into its forward
  // gather buffer, with copies in the backward and eval gather buffers where they exist).
  void home_value(size_t bi, size_t j) {
    const ZeroBucket& b = L.buckets[bi];
    const int pi = b.params[j];
    const ParamEntry& e = p.params()[size_t(pi)];
    bucket_of[size_t(pi)] = int(bi);
    const uint64_t at = b.bytes ? 0 : dtype_bytes(p.tensor(e.value).dtype, b.offsets[j]);
    if (stage != 3) return make_view(e.value, param_root[bi], at);
    if (!b.bytes) return home_stored(bi, e.value, at);
    const std::vector<int64_t> parts = stored_part_offsets(p, e, b.offsets[j]);  // a quantised base's
    for (size_t k = 0; k < e.storage.size(); ++k) home_stored(bi, e.storage[k].id, uint64_t(parts[k]));
  }

  // Stage 3: tensor id at byte `at` of bucket bi's gather buffers.
  void home_stored(size_t bi, TensorId id, uint64_t at) {
    const TensorDesc v = p.tensor(id);
    if (gather_bwd[bi] != kNoTensor && gather_bwd[bi] != gather_fwd[bi])
      bwd_view[id] = p.add_view(gather_bwd[bi], v.name + ".backward", v.shape, v.dtype, at);
    if (!gather_eval.empty() && gather_eval[bi] != kNoTensor)
      eval_view[id] = p.add_view(gather_eval[bi], v.name + ".eval", v.shape, v.dtype, at);
    make_view(id, gather_fwd[bi], at);
  }

  // Stage >= 1: masters and state shrink to this rank's piece; pieces of values and grads.
  void shard_state() {
    for (size_t bi = 0; bi < L.buckets.size(); ++bi) {
      const ZeroBucket& b = L.buckets[bi];
      for (size_t j = 0; j < b.params.size(); ++j) {
        const int pi = b.params[j];
        ParamEntry& e = p.params()[size_t(pi)];
        if (b.bytes) {
          shard_stored_tensors(p, L, bi, param_root[bi], e, b.offsets[j]);
          continue;
        }
        const int64_t numel = p.tensor(e.value).numel();
        const auto [first, count] = L.piece(b, b.offsets[j], numel);
        piece_first[size_t(pi)] = first;
        piece_count[size_t(pi)] = count;
        e.shard_offset = first;
        e.shard_numel = count;
        if (b.frozen) {  // stage 3 only: its piece of the value, nothing to update
          if (count > 0)
            e.value_shard = value_piece[size_t(pi)] =
                p.add_view(param_root[bi], e.name + ".shard", Shape{count}, p.tensor(e.value).dtype,
                           dtype_bytes(p.tensor(e.value).dtype, b.offsets[j] + first - int64_t(rank) * L.shard(b)));
          continue;
        }
        const bool q8 = e.state.size() == 4;
        if (e.master != kNoTensor) p.tensor(e.master).shape = Shape{count};
        for (size_t s = 0; s < e.state.size(); ++s)
          p.tensor(e.state[s]).shape = Shape{q8 && s >= 2 ? (count + kQuantBlock - 1) / kQuantBlock : count};
        if (count == 0) continue;
        const int64_t at = b.offsets[j] + first;
        const DType pdt = p.tensor(e.value).dtype, gdt = p.tensor(e.grad).dtype;
        const int64_t in_shard = at - int64_t(rank) * L.shard(b);
        value_piece[size_t(pi)] = p.add_view(param_root[bi], e.name + ".shard", Shape{count}, pdt,
                                             dtype_bytes(pdt, stage == 3 ? in_shard : at));
        if (stage == 3) e.value_shard = value_piece[size_t(pi)];
        if (stage >= 2)
          grad_piece[size_t(pi)] = p.add_view(grad_shard_root[bi], "grad." + e.name + ".shard", Shape{count}, gdt,
                                              dtype_bytes(gdt, at - int64_t(rank) * L.shard(b)));
        else
          grad_piece[size_t(pi)] = p.add_view(grad_root[bi], "grad." + e.name + ".shard", Shape{count}, gdt,
                                              dtype_bytes(gdt, at));
        param_of_target[update_target(e)] = pi;
      }
    }
  }

  // The update op restricted to this rank's pieces (nullopt when it holds none of them).
  std::optional<Op> shard_update(const Op& op) {
    const AdamWAttrs& a = std::get<AdamWAttrs>(op.attrs);
    const size_t n = op.inputs.size() - (a.max_grad_norm > 0 ? 1 : 0);
    const size_t roles = op.outputs.size() / n;
    Op out = op;
    AdamWAttrs na = a;
    na.weight_decay.clear();
    out.inputs.clear();
    out.outputs.clear();
    std::vector<std::vector<TensorId>> by_role(roles);
    double elements = 0, total = 0;
    for (size_t i = 0; i < n; ++i) {
      const int pi = param_of_grad.at(op.inputs[i]);
      total += double(p.tensor(p.params()[size_t(pi)].value).numel());
      if (piece_count[size_t(pi)] == 0) continue;
      elements += double(piece_count[size_t(pi)]);
      out.inputs.push_back(grad_piece[size_t(pi)]);
      const ParamEntry& e = p.params()[size_t(pi)];
      by_role[0].push_back(e.master != kNoTensor ? e.master : value_piece[size_t(pi)]);
      for (size_t r = 1; r < roles; ++r) by_role[r].push_back(op.outputs[r * n + i]);
      if (!a.weight_decay.empty()) na.weight_decay.push_back(a.weight_decay[i]);
    }
    if (out.inputs.empty()) return std::nullopt;
    if (a.max_grad_norm > 0) out.inputs.push_back(op.inputs.back());
    for (const auto& role : by_role) out.outputs.insert(out.outputs.end(), role.begin(), role.end());
    out.modes.assign(out.outputs.size(), WriteMode::update);
    out.attrs = na;
    out.flops = total > 0 ? op.flops * elements / total : 0;
    return out;
  }

  // Per bucket, the first and the last micro-section op that write its gradients (-1: none).
  // The bucket's unused tail (after its last parameter) is zeroed just before the first, so
  // reductions never read stale bytes and the arena's measured high-water mark sees the whole
  // bucket written; reductions go right after the last.
  struct GradWriters {
    std::vector<int> first, last;
  };
  GradWriters grad_writers(const std::vector<Op>& old, const Section& micro) const {
    GradWriters w{std::vector<int>(L.buckets.size(), -1), std::vector<int>(L.buckets.size(), -1)};
    for (int i = micro.begin; i < micro.end; ++i)
      for (TensorId id : old[size_t(i)].outputs)
        if (id != kNoTensor)
          if (auto it = param_of_grad.find(id); it != param_of_grad.end()) {
            const size_t bi = size_t(bucket_of[size_t(it->second)]);
            if (w.first[bi] < 0) w.first[bi] = i;
            w.last[bi] = i;
          }
    return w;
  }

  void rebuild() {
    const std::vector<Op> old = p.ops();
    std::vector<Op> ops;
    std::vector<int> section_of;
    auto push = [&](Op op, int s) {
      ops.push_back(std::move(op));
      section_of.push_back(s);
    };
    const TensorId loss = p.find_tensor(kLoss), eval_loss = p.find_tensor(kEvalLoss);
    const TensorId flag = p.find_tensor(kOverflowFlag);
    const Section* micro = p.find_section(SectionKind::micro);
    MEMFIT_ASSERT(micro != nullptr, "ZeRO on a program without a micro section");
    const int micro_index = p.section_of_op(micro->begin);
    const Section* sync = p.find_section(SectionKind::sync);
    const int sync_index = sync ? int(sync - p.sections().data()) : -1;
    MEMFIT_ASSERT(sync_index == micro_index + 1, "ZeRO needs the sync section right after the micro section");
    const int k = micro->repeat;

    // Stage 2 and 3 reduce each bucket right after its last writer; so do stages 0 and 1 with
    // one micro-step (as PyTorch DDP does), so that the reduction can overlap the rest of the
    // backward. With accumulation, stages 0 and 1 reduce once, after the last micro-step, at
    // the start of the optimizer section.
    const bool sync_in_backward = stage >= 2 || k == 1;
    const GradWriters writers = grad_writers(old, *micro);
    const std::vector<int>& first_writer = writers.first;
    const std::vector<int> last_writer = sync_in_backward ? writers.last : std::vector<int>(L.buckets.size(), -1);

    const std::vector<std::vector<size_t>> gathers_before = stage == 3 ? plan_gathers(old) : std::vector<std::vector<size_t>>();
    // The same per op, in bucket order: the loop below looks them up instead of scanning every
    // bucket at every op (that scan made the pass quadratic in the layer count).
    const int last_sync = *std::max_element(last_writer.begin(), last_writer.end());
    std::vector<std::vector<size_t>> fills_before(old.size()), syncs_after(old.size());
    for (size_t bi = 0; bi < L.buckets.size(); ++bi) {
      if (first_writer[bi] >= 0) fills_before[size_t(first_writer[bi])].push_back(bi);
      if (last_writer[bi] >= 0) syncs_after[size_t(last_writer[bi])].push_back(bi);
    }

    for (size_t i = 0; i < old.size(); ++i) {
      for (size_t bi : fills_before[i]) emit_tail_fill(bi, push, p.section_of_op(int(i)));
      if (stage == 3)
        for (size_t g : gathers_before[i]) emit_gather(g, push, p.section_of_op(int(i)));
      if (stage == 3) emit_arrivals(arrivals_before[i], push, p.section_of_op(int(i)));
      Op op = old[i];
      const int s = p.section_of_op(int(i));
      const SectionKind sk = p.sections()[size_t(s)].kind;
      if (stage == 3) retarget_parameters(op, sk);
      // Each data-parallel rank sees 1/world of the global batch: scales divide by the data degree.
      if (op.kind == OpKind::classifier || op.kind == OpKind::classifier_parallel_backward) {
        auto& c = std::get<ClassifierAttrs>(op.attrs);
        c.grad_scale = 1.0f / float(c.rows * int64_t(k) * world);
      }
      if (op.kind == OpKind::loss_mean) {
        const int64_t rows = p.tensor(op.inputs[0]).numel();
        std::get<ScaleAttrs>(op.attrs).scale = 1.0f / float(rows * (sk == SectionKind::micro ? int64_t(k) : 1) * world);
      }
      if (sk == SectionKind::optimizer && int(i) == p.sections()[size_t(s)].begin && !sync_in_backward)
        for (size_t bi = 0; bi < L.buckets.size(); ++bi)
          if (!L.buckets[bi].frozen) emit_bucket_sync(bi, push, s);
      bool replaced = false;  // the op was re-emitted in sharded form (or dropped)
      if (sk == SectionKind::optimizer && stage >= 1) {
        replaced = true;
        if (op.kind == OpKind::grad_norm) {
          emit_sharded_norm(op, push, s, norm_inputs(shard_pieces_by_param()), sharded_norm_group());
        } else if (op.kind == OpKind::adamw || op.kind == OpKind::adamw8bit) {
          if (auto u = shard_update(op)) push(std::move(*u), s);
        } else if (op.kind == OpKind::cast && param_of_target.count(op.inputs[0])) {
          const int pi = param_of_target.at(op.inputs[0]);
          op.outputs[0] = value_piece[size_t(pi)];
          op.flops = double(piece_count[size_t(pi)]);
          push(std::move(op), s);
        } else if (op.kind == OpKind::cast && p.tensor(op.inputs[0]).category == Category::master_weights) {
          // the master of a parameter this rank holds no piece of: nothing to narrow
        } else {
          replaced = false;
        }
      }
      if (sk == SectionKind::optimizer && stage == 0 && topo.tensor > 1 && op.kind == OpKind::grad_norm)
        emit_tensor_parallel_norm(op, push, s), replaced = true;
      if (!replaced) {
        if (stage >= 2 && s == micro_index) {
          for (size_t j = 0; j < op.outputs.size(); ++j)
            if (param_of_grad.count(op.outputs[j]) && op.modes[j] == WriteMode::accumulate_after_first_micro)
              op.modes[j] = WriteMode::overwrite;  // the bucket is transient: each micro-step starts afresh
          if (op.kind == OpKind::check_finite) op.inputs = shard_pieces();
        }
        push(std::move(op), s);
      }
      for (size_t bi : syncs_after[i]) {
        if (stage >= 2) emit_bucket_reduce_scatter(bi, push, s, k);
        else emit_bucket_sync(bi, push, s);
      }
      if (qgz && int(i) == last_sync) flush_qgz(push, s);  // nothing left to overlap with
      const bool section_end = int(i) + 1 == p.sections()[size_t(s)].end;
      // Once per step, after the last micro-step, whether or not the optimizer runs.
      if (section_end && s == micro_index) {
        if (loss != kNoTensor)
          push(collective(OpKind::all_reduce, "zero.all_reduce.loss", {}, {loss}, Phase::communication, -1), sync_index);
        if (flag != kNoTensor)
          push(collective(OpKind::all_reduce, "zero.all_reduce.overflow_flag", {}, {flag}, Phase::communication, -1,
                          true),
               sync_index);
      }
      if (section_end && sk == SectionKind::optimizer && (stage == 1 || stage == 2))
        for (size_t bi = 0; bi < L.buckets.size(); ++bi) {
          const ZeroBucket& b = L.buckets[bi];
          if (b.frozen) continue;  // (none below stage 3; never updated)
          const TensorId mine = p.add_view(param_root[bi], "zero.params." + b.tag + ".shard", Shape{L.shard(b)},
                                           p.tensor(param_root[bi]).dtype,
                                           dtype_bytes(p.tensor(param_root[bi]).dtype, int64_t(rank) * L.shard(b)));
          push(collective(OpKind::all_gather, "zero.all_gather." + b.tag, {mine}, {param_root[bi]},
                          Phase::communication, b.layer),
               s);
        }
      if (section_end && sk == SectionKind::eval && eval_loss != kNoTensor)
        push(collective(OpKind::all_reduce, "zero.all_reduce.eval_loss", {}, {eval_loss}, Phase::communication, -1), s);
    }
    p.replace_ops(std::move(ops), section_of);
  }

  std::vector<TensorId> shard_pieces() const {
    std::vector<TensorId> out;
    for (const auto& piece : shard_pieces_by_param()) out.push_back(piece.second);
    return out;
  }

  // Stage 3: backward and recompute ops read the backward gather's copy of a parameter,
  // validation ops the eval gather's (the forward's is the parameter tensor itself).
  void retarget_parameters(Op& op, SectionKind section) {
    const std::map<TensorId, TensorId>* to = nullptr;
    if (section == SectionKind::micro && (op.phase == Phase::backward || op.phase == Phase::recompute)) to = &bwd_view;
    if (section == SectionKind::eval) to = &eval_view;
    if (!to) return;
    for (TensorId& id : op.inputs)
      if (auto it = to->find(id); it != to->end()) id = it->second;
  }

  // Gather g encodes (pass, bucket) as pass * buckets + bucket; pass 0 forward, 1 backward, 2 eval.
  // qwZ: the shard is coded into this rank's block of the wire, the wire is gathered, and the
  // decoder waits in qwz_of[g] for the bucket's first use.
  template <class Push>
  void emit_gather(size_t g, Push& push, int s) {
    const size_t nb = L.buckets.size(), bi = g % nb, pass = g / nb;
    const TensorId buf = (pass == 0 ? gather_fwd : pass == 1 ? gather_bwd : gather_eval)[bi];
    static const char* names[] = {"forward", "backward", "eval"};
    const std::string name = fmt::format("zero.all_gather.{}.{}", L.buckets[bi].tag, names[pass]);
    if (pass == 1 && hpz > 1)  // hpZ: unquantised, from the secondary, inside the hpZ group
      return push(hpz_gather(p, name, hpz_of[bi].secondary, buf, hpz, L.buckets[bi].layer), s);
    if (qwz) qwz_of.resize(3 * nb);
    if (!qwz || L.buckets[bi].bytes) {  // qwZ codes floats; a quantised base's bytes go as they are
      push(collective(OpKind::all_gather, name, {param_root[bi]}, {buf}, Phase::communication, L.buckets[bi].layer), s);
      return;
    }
    qwz_of[g] = qwz_gather(p, L, bi, param_root[bi], buf, name);
    push(qwz_of[g].quantize, s);
    push(collective(OpKind::all_gather, name, {qwz_of[g].mine}, {qwz_of[g].wire}, Phase::communication,
                    L.buckets[bi].layer),
         s);
  }

  // Before a bucket's first use: qwZ's decode, then hpZ's copy of this rank's piece (forward only).
  template <class Push>
  void emit_arrivals(const std::vector<size_t>& arrivals, Push& push, int s) {
    for (size_t g : arrivals) {
      if (qwz && qwz_of[g].wire != kNoTensor) push(qwz_of[g].dequantize, s);
      if (g < hpz_of.size() && hpz_of[g].secondary != kNoTensor) push(hpz_of[g].copy, s);
    }
  }

  // For each old op, the gathers to issue just before it. Within a pass, buckets are ordered
  // by first use; the first bucket's gather and the next one's are issued before the first
  // use, and each later bucket's gather before the previous bucket's first use (prefetch:
  // the next block's parameters arrive while the current block computes, at the cost of
  // one more gathered block alive, which the plan shows as communication buffers).
  std::vector<std::vector<size_t>> plan_gathers(const std::vector<Op>& old) {
    std::vector<std::vector<size_t>> before(old.size());
    arrivals_before.assign(old.size(), {});
    const size_t nb = L.buckets.size();
    for (size_t pass = 0; pass < (gather_eval.empty() ? 2u : 3u); ++pass) {
      const std::vector<int> first = first_uses(old, pass);
      std::vector<size_t> order;
      for (size_t bi = 0; bi < nb; ++bi)
        if (first[bi] >= 0) order.push_back(bi);
      std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return first[a] < first[b]; });
      for (size_t j = 0; j < order.size(); ++j) {
        const int at = first[order[j == 0 ? 0 : j - 1]];
        before[size_t(at)].push_back(pass * nb + order[j]);
        arrivals_before[size_t(first[order[j]])].push_back(pass * nb + order[j]);
      }
    }
    return before;
  }

  std::vector<int> first_uses(const std::vector<Op>& ops, size_t pass) const {
    return bucket_first_uses(p, L, ops, pass);
  }

  template <class Push>
  void emit_tail_fill(size_t bi, Push& push, int s) {
    if (std::optional<Op> fill = bucket_padding_fill(p, L.buckets[bi], grad_root[bi])) push(std::move(*fill), s);
  }

  template <class Push>
  void flush_qgz(Push& push, int s) {
    for (Op& op : qgz_later) push(std::move(op), s);
    qgz_later.clear();
  }

  template <class Push>
  void emit_bucket_reduce_scatter(size_t bi, Push& push, int s, int k) {
    const ZeroBucket& b = L.buckets[bi];
    const TensorId shard = grad_shard_root[bi];
    if (qgz) {
      flush_qgz(push, s);
      QgzReduce r = qgz_reduce_scatter(p, L, bi, topo, qgz_bits, grad_root[bi], shard, k);
      for (Op& op : r.now) push(std::move(op), s);
      qgz_later = std::move(r.later);
      return;
    }
    if (k == 1) {
      push(collective(OpKind::reduce_scatter, "zero.reduce_scatter." + b.tag, {grad_root[bi]}, {shard},
                      Phase::communication, b.layer),
           s);
      return;
    }
    const TensorId buf = add_root("zero.reduce_scatter." + b.tag + ".buffer", L.shard(b), p.tensor(shard).dtype,
                                  Category::communication, Lifetime::transient, b.layer);
    push(collective(OpKind::reduce_scatter, "zero.reduce_scatter." + b.tag, {grad_root[bi]}, {buf},
                    Phase::communication, b.layer),
         s);
    push(accumulate_shard(L, bi, buf, shard), s);
  }

  // Stages 0 and 1: bucket bi's gradients all-reduced (0) or reduce-scattered in place into
  // this rank's block of the full-size buffer (1).
  template <class Push>
  void emit_bucket_sync(size_t bi, Push& push, int s) {
    const ZeroBucket& b = L.buckets[bi];
    if (stage == 0) {
      push(collective(OpKind::all_reduce, "zero.all_reduce." + b.tag, {}, {grad_root[bi]}, Phase::communication,
                      b.layer),
           s);
      return;
    }
    const DType gdt = p.tensor(grad_root[bi]).dtype;
    const TensorId mine = p.add_view(grad_root[bi], "zero.grads." + b.tag + ".shard", Shape{L.shard(b)}, gdt,
                                     dtype_bytes(gdt, int64_t(rank) * L.shard(b)));
    push(collective(OpKind::reduce_scatter, "zero.reduce_scatter." + b.tag, {grad_root[bi]}, {mine},
                    Phase::communication, b.layer),
         s);
  }

  std::vector<std::pair<size_t, TensorId>> shard_pieces_by_param() const {
    std::vector<std::pair<size_t, TensorId>> out;
    for (size_t pi = 0; pi < grad_piece.size(); ++pi)
      if (grad_piece[pi] != kNoTensor) out.push_back({pi, grad_piece[pi]});
    MEMFIT_CHECK(!out.empty(), "policy", "rank {} of {} holds no gradient elements: too many ranks for this model", rank,
                 world);
    return out;
  }

  std::vector<TensorId> norm_inputs(const std::vector<std::pair<size_t, TensorId>>& grads) const {
    std::vector<TensorId> out;
    for (const auto& [pi, g] : grads)
      if (counts_in_global_norm(p.params()[pi].split, topo.tensor_rank())) out.push_back(g);
    return out;
  }

  // Sharded gradients: the sum of squares runs over the data group (and the tensor group).
  CollectiveAttrs sharded_norm_group() const {
    return topo.tensor > 1 ? CollectiveAttrs{CommGroup::world, everywhere, false} : CollectiveAttrs{CommGroup::data, world, false};
  }

  // Stage 0 under tensor parallelism: whole gradients, equal on the data ranks, so the norm's
  // sum of squares runs over the tensor group only.
  template <class Push>
  void emit_tensor_parallel_norm(const Op& op, Push& push, int s) {
    std::vector<std::pair<size_t, TensorId>> grads;
    for (size_t pi = 0; pi < p.params().size(); ++pi)
      if (p.params()[pi].grad != kNoTensor) grads.push_back({pi, p.params()[pi].grad});
    emit_sharded_norm(op, push, s, norm_inputs(grads), CollectiveAttrs{CommGroup::tensor, topo.tensor, false});
  }

  template <class Push>
  void emit_sharded_norm(const Op& op, Push& push, int s, const std::vector<TensorId>& grads, CollectiveAttrs group) {
    for (Op& o : sharded_norm_ops(p, op, grads, group)) push(std::move(o), s);
  }
};

}  // namespace

void apply_zero(Program& p, const Policy& policy, const Topology& topo) {
  ZeroPass z{p, policy, zero_layout(p, policy, topo)};
  if (policy.zero_stage == 0 && topo.world() == 1) return;
  z.stage = policy.zero_stage;
  z.world = topo.data;
  z.rank = topo.data_rank();
  z.everywhere = topo.world();
  z.qwz = policy.zero_quantized_weights;
  z.qgz = policy.zero_quantized_gradients && z.stage >= 2;
  z.qgz_bits = policy.zero_quantized_gradient_bits;
  z.topo = topo;
  z.hpz = hpz_partition(policy, topo);
  z.build_buckets();
  if (z.stage >= 1) z.shard_state();
  z.rebuild();
}

}  // namespace memfit
