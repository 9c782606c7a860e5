#include "graph/offload.hpp"

#include <algorithm>
#include <array>
#include <map>
#include <set>

#include "core/error.hpp"

namespace memfit {

std::string offload_refusal(const Policy& p) {
  if (p.offload_params != Tier::device) {
    const std::string flag = fmt::format("--offload-params {}", tier_name(p.offload_params));
    // DeepSpeed's rule: only stage 3 gathers parameters from shards, which is what moves.
    if (p.zero_stage != 3)
      return fmt::format("parameter offload ({}) needs ZeRO stage 3, as DeepSpeed's offload_param does: add --zero 3",
                         flag);
    if (p.update_in_backward)
      return fmt::format("parameter offload ({}) with the update in the backward pass is not supported: drop "
                         "--optimizer-in-backward", flag);
  }
  if (p.offload_optimizer == Tier::device) return "";
  if (p.update_in_backward) return "optimizer offload with the update in the backward pass is not supported";
  if (p.offload_chunk_elements < 0 || p.offload_chunk_elements % kOffloadChunkGranule != 0)
    return fmt::format("the offload chunk must be a positive multiple of {} elements (got {})", kOffloadChunkGranule,
                       p.offload_chunk_elements);
  return "";
}

UpdateSlots update_slots(const Op& op) {
  const AdamWAttrs& a = std::get<AdamWAttrs>(op.attrs);
  UpdateSlots s;
  s.clips = a.max_grad_norm > 0;
  s.n = op.inputs.size() - (s.clips ? 1 : 0);
  s.roles = op.kind == OpKind::adamw8bit ? 5 : 3;
  MEMFIT_ASSERT(s.n > 0 && op.outputs.size() == s.n * s.roles, "update op '{}': {} outputs for {} gradients", op.name,
                op.outputs.size(), s.n);
  return s;
}

bool is_update_op(const Op& op) { return op.kind == OpKind::adamw || op.kind == OpKind::adamw8bit; }

Op transfer_op(const Program& p, const std::string& name, TensorId src, TensorId dst, int layer) {
  Op op;
  op.kind = OpKind::transfer;
  op.name = name;
  op.phase = Phase::transfer;
  op.layer = layer;
  op.inputs = {src};
  op.outputs = {dst};
  op.modes = {WriteMode::overwrite};
  const bool outward = p.tensor(dst).tier > p.tensor(src).tier;
  op.queue = outward ? Queue::transfer_out : Queue::transfer_in;
  return op;
}

namespace {

constexpr int kStagingSets = 3;                // read ahead, update, write behind
constexpr uint64_t kStagingAlignment = 4096;  // O_DIRECT: every staged tensor starts on a block

class OptimizerOffload {
 public:
  OptimizerOffload(Program& p, const Policy& policy)
      : p_(p), tier_(policy.offload_optimizer),
        chunk_(policy.offload_chunk_elements > 0 ? policy.offload_chunk_elements : kDefaultOffloadChunk) {}

  void run() {
    const Section* opt = p_.find_section(SectionKind::optimizer);
    MEMFIT_ASSERT(opt != nullptr, "optimizer offload on a program without an optimizer section");
    const int sec = p_.section_of_op(opt->begin);
    std::vector<Op> old = p_.ops();
    std::vector<int> section_of(old.size());
    for (size_t i = 0; i < old.size(); ++i) section_of[i] = p_.section_of_op(int(i));

    // The tensors that move (roots: a master or state piece may be a view of a flat buffer)
    // and, per offloaded master, the cast that narrows it into the 16-bit parameter.
    for (int i = opt->begin; i < opt->end; ++i) {
      const Op& op = old[size_t(i)];
      if (is_update_op(op)) collect_offloaded(op);
    }
    for (int i = opt->begin; i < opt->end; ++i) {
      const Op& op = old[size_t(i)];
      if (op.kind == OpKind::cast && offloaded_.count(p_.root_of(op.inputs[0]))) narrow_to_[op.inputs[0]] = op.outputs[0];
    }
    check_only_optimizer_touches(old, *opt);
    move_to_offload_tier();
    // The host tier is memory the optimizer's kernels reach (ZeRO-Offload's CPU Adam): the
    // update runs where its state lives and nothing streams.
    if (tier_ == Tier::host) return;

    std::vector<Op> ops;
    std::vector<int> sections;
    auto push = [&](Op op, int s) {
      ops.push_back(std::move(op));
      sections.push_back(s);
    };
    // All update ops stream as one pipeline, where the first of them was (the updates are
    // independent of each other, and the read-ahead then crosses from one op to the next).
    std::vector<const Op*> updates;
    for (int i = opt->begin; i < opt->end; ++i)
      if (is_update_op(old[size_t(i)])) updates.push_back(&old[size_t(i)]);
    bool streamed = false;
    for (size_t i = 0; i < old.size(); ++i) {
      const Op& op = old[i];
      if (section_of[i] != sec) {
        push(op, section_of[i]);
        continue;
      }
      if (is_update_op(op)) {
        if (!streamed)
          for (Op& o : stream_updates(updates)) push(std::move(o), sec);
        streamed = true;
      } else if (!(op.kind == OpKind::cast && narrow_to_.count(op.inputs[0]))) {
        push(op, sec);  // casts of offloaded masters run inside the chunk loop
      }
    }
    p_.replace_ops(std::move(ops), sections);
  }

 private:
  void collect_offloaded(const Op& op) {
    const UpdateSlots s = update_slots(op);
    for (size_t i = 0; i < s.n; ++i) {
      const TensorId target = op.outputs[i];
      if (p_.tensor(target).category == Category::master_weights) offloaded_.insert(p_.root_of(target));
      for (size_t r = 1; r < s.roles; ++r) offloaded_.insert(p_.root_of(op.outputs[r * s.n + i]));
    }
  }

  // The offloaded bytes are reachable by transfers only (on a GPU the host tier is not the
  // kernels' memory): nothing outside the optimizer's updates and narrowing casts may name them.
  void check_only_optimizer_touches(const std::vector<Op>& old, const Section& opt) const {
    for (int i = 0; i < int(old.size()); ++i) {
      const Op& op = old[size_t(i)];
      const bool inside = i >= opt.begin && i < opt.end;
      if (inside && (is_update_op(op) || (op.kind == OpKind::cast && narrow_to_.count(op.inputs[0])))) continue;
      for (const auto* list : {&op.inputs, &op.outputs, &op.workspace})
        for (TensorId id : *list)
          // LoRA's frozen matmuls leave absent operands as kNoTensor.
          MEMFIT_CHECK(id == kNoTensor || !offloaded_.count(p_.root_of(id)), "policy",
                       "op '{}' reads or writes '{}', which optimizer offload moves off the device; this combination "
                       "is not supported", op.name, p_.tensor(id).name);
    }
  }

  void move_to_offload_tier() {
    for (TensorId root : offloaded_) {
      TensorDesc& t = p_.tensor(root);
      MEMFIT_ASSERT(t.lifetime == Lifetime::persistent, "offloaded tensor {} is not persistent", t.name);
      t.tier = tier_;
    }
    for (TensorId id = 0; id < TensorId(p_.tensors().size()); ++id)
      if (p_.tensor(id).is_view() && offloaded_.count(p_.tensor(id).view_of)) p_.tensor(id).tier = tier_;
  }

  // A chunk of `of`: elements [lo, lo + n) of a tensor of `elements` elements (8-bit absmax
  // tensors hold one value per block, so their chunk is the blocks of [lo, lo + n)).
  TensorId piece(TensorId of, int64_t lo, int64_t n, int64_t elements, const std::string& tag) {
    const TensorDesc& t = p_.tensor(of);
    int64_t first = lo, count = n;
    if (t.numel() != elements) {  // blockwise: one value per `block` elements
      const int64_t block = block_;
      MEMFIT_ASSERT(lo % block == 0 && t.numel() == (elements + block - 1) / block, "{}: not {} blocks of {}", t.name,
                    t.numel(), block);
      first = lo / block;
      count = (n + block - 1) / block;
    }
    if (first == 0 && count == t.numel()) return of;
    return p_.add_view(of, t.name + tag, Shape{count}, t.dtype, dtype_bytes(t.dtype, first));
  }

  // One chunk of one parameter's update: which op and parameter slot, its elements, and where
  // each streamed role sits in its staging set (staging_layout, filled by make_staging_sets).
  struct ChunkSpec {
    const Op* op;
    size_t slot;
    int64_t lo, n;
    std::vector<uint64_t> offsets;
  };

  // Bytes of each update output role of a chunk that stream (offloaded roles), laid out one
  // after another in a staging set, each starting on a 4 KiB boundary (O_DIRECT); 0 for roles
  // that stay put. Returns the end of the last one.
  uint64_t staging_layout(const ChunkSpec& c, std::vector<uint64_t>& offsets) const {
    const UpdateSlots s = update_slots(*c.op);
    const int64_t elements = p_.tensor(c.op->inputs[c.slot]).numel();
    offsets.assign(s.roles, 0);
    uint64_t end = 0;
    for (size_t r = 0; r < s.roles; ++r) {
      const TensorId whole = c.op->outputs[r * s.n + c.slot];
      if (!offloaded_.count(p_.root_of(whole))) continue;
      const TensorDesc& t = p_.tensor(whole);
      const int64_t count = t.numel() == elements ? c.n : (c.n + block_ - 1) / block_;
      offsets[r] = (end + kStagingAlignment - 1) / kStagingAlignment * kStagingAlignment;
      end = offsets[r] + dtype_bytes(t.dtype, count);
    }
    return end;
  }

  // The ring of staging sets: chunk k stages in set k % kStagingSets. Each set is sized for the
  // largest chunk it holds, so that chunk's transfer in writes its last byte and the host
  // tier's measured high-water mark meets the plan.
  void make_staging_sets(std::vector<ChunkSpec>& chunks) {
    std::array<uint64_t, kStagingSets> bytes{};
    for (size_t k = 0; k < chunks.size(); ++k)
      bytes[k % kStagingSets] = std::max(bytes[k % kStagingSets], staging_layout(chunks[k], chunks[k].offsets));
    for (int set = 0; set < kStagingSets; ++set) {
      sets_[size_t(set)] = kNoTensor;
      if (bytes[size_t(set)] == 0) continue;
      TensorDesc d;
      d.name = fmt::format("offload.staging.{}", set);
      d.shape = Shape{int64_t(bytes[size_t(set)])};
      d.dtype = DType::u8;
      d.category = Category::offload_staging;
      d.tier = Tier::host;  // 4 KiB aligned (memory/buffer_type.hpp): the disk file moves with O_DIRECT
      d.lifetime = Lifetime::transient;
      sets_[size_t(set)] = p_.add_tensor(std::move(d));
    }
  }

  // One chunk of one parameter's update: its transfers in, the update, the narrowing cast and
  // its transfers out.
  struct Chunk {
    std::vector<Op> in, work, out;
  };

  Chunk chunk_of(const ChunkSpec& spec, size_t k, double total) {
    const Op& op = *spec.op;
    const UpdateSlots s = update_slots(op);
    const size_t i = spec.slot;
    const int64_t lo = spec.lo, n = spec.n;
    const std::vector<uint64_t>& offsets = spec.offsets;
    const TensorId set = sets_[k % kStagingSets];
    const TensorId grad = op.inputs[i];
    const int64_t elements = p_.tensor(grad).numel();
    const std::string tag = elements > n ? fmt::format("[{}:{}]", lo, lo + n) : "";
    Chunk c;
    Op update = op;
    update.name = op.name + "." + p_.tensor(op.outputs[i]).name + tag;
    update.inputs = {piece(grad, lo, n, elements, tag)};
    if (s.clips) update.inputs.push_back(op.inputs.back());
    update.outputs.clear();
    const int layer = p_.tensor(grad).layer;
    update.layer = layer;
    TensorId target_staging = kNoTensor;
    for (size_t r = 0; r < s.roles; ++r) {
      const TensorId whole = op.outputs[r * s.n + i];
      const TensorId part = piece(whole, lo, n, elements, tag);
      if (!offloaded_.count(p_.root_of(whole))) {
        update.outputs.push_back(part);  // a parameter the optimizer updates in place
        continue;
      }
      const TensorDesc& pt = p_.tensor(part);
      const TensorId stage = p_.add_view(set, "offload.staging." + pt.name, pt.shape, pt.dtype, offsets[r]);
      c.in.push_back(transfer_op(p_, "offload.in." + p_.tensor(part).name, part, stage, layer));
      c.out.push_back(transfer_op(p_, "offload.out." + p_.tensor(part).name, stage, part, layer));
      update.outputs.push_back(stage);
      if (r == 0) target_staging = stage;
    }
    update.modes.assign(update.outputs.size(), WriteMode::update);
    AdamWAttrs& a = std::get<AdamWAttrs>(update.attrs);
    const AdamWAttrs& group = std::get<AdamWAttrs>(op.attrs);
    a.weight_decay = {group.weight_decay.empty() ? 0.0f : group.weight_decay[i]};
    update.flops = op.flops * double(n) / std::max(1.0, total);
    c.work.push_back(std::move(update));
    if (auto it = narrow_to_.find(op.outputs[i]); it != narrow_to_.end()) {
      const TensorId value = piece(it->second, lo, n, p_.tensor(it->second).numel(), tag);
      Op cast;
      cast.kind = OpKind::cast;
      cast.name = "cast." + p_.tensor(it->second).name + tag;
      cast.phase = Phase::optimizer;
      cast.layer = layer;
      cast.inputs = {target_staging};
      cast.outputs = {value};
      cast.modes = {WriteMode::overwrite};
      cast.flops = double(n);
      c.work.push_back(std::move(cast));
    }
    return c;
  }

  // The update ops as chunks, each chunk's transfers in emitted before the previous chunk's
  // update (read ahead by one chunk), its transfers out right after its own update. Chunk k+3
  // reuses chunk k's staging set, so schedule_async waits for chunk k's writes before chunk
  // k+3's reads start: read k+1, update k, write k-1, and never more.
  std::vector<Op> stream_updates(const std::vector<const Op*>& updates) {
    std::vector<ChunkSpec> specs;
    std::map<const Op*, double> totals;
    for (const Op* op : updates) {
      const UpdateSlots s = update_slots(*op);
      block_ = std::get<AdamWAttrs>(op->attrs).block;
      for (size_t i = 0; i < s.n; ++i) {
        const int64_t elements = p_.tensor(op->inputs[i]).numel();
        totals[op] += double(elements);
        for (int64_t lo = 0; lo < elements; lo += chunk_) specs.push_back({op, i, lo, std::min(chunk_, elements - lo), {}});
      }
    }
    make_staging_sets(specs);
    std::vector<Chunk> chunks;
    for (size_t k = 0; k < specs.size(); ++k) chunks.push_back(chunk_of(specs[k], k, totals.at(specs[k].op)));
    std::vector<Op> out;
    auto append = [&out](std::vector<Op>& ops) {
      for (Op& o : ops) out.push_back(std::move(o));
    };
    if (!chunks.empty()) append(chunks[0].in);
    for (size_t k = 0; k < chunks.size(); ++k) {
      if (k + 1 < chunks.size()) append(chunks[k + 1].in);
      append(chunks[k].work);
      append(chunks[k].out);
    }
    return out;
  }

  Program& p_;
  Tier tier_;
  int64_t chunk_;
  int64_t block_ = 256;  // 8-bit AdamW's quantisation block (every update op of a program has the same)
  std::array<TensorId, kStagingSets> sets_{};
  std::set<TensorId> offloaded_;
  std::map<TensorId, TensorId> narrow_to_;  // offloaded master (as the update names it) -> 16-bit parameter
};

}  // namespace

void apply_optimizer_offload(Program& p, const Policy& policy) {
  if (policy.offload_optimizer == Tier::device) return;
  const std::string why = offload_refusal(policy);
  MEMFIT_CHECK(why.empty(), "policy", "{}", why);
  OptimizerOffload(p, policy).run();
}

}  // namespace memfit
