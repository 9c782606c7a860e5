#include "plan/memory_plan.hpp"

#include <algorithm>
#include <map>
#include <numeric>

#include "core/bytes.hpp"
#include "core/checked.hpp"
#include "core/error.hpp"

namespace memfit {

namespace {

uint64_t align_up(uint64_t x, uint64_t alignment) { return (x + alignment - 1) / alignment * alignment; }

// A buffer is a run of bytes holding one root tensor, or a chain of roots that replace each
// other in place; its members' intervals touch end to start.
struct Buffer {
  Tier tier = Tier::device;
  bool persistent = false;
  uint64_t bytes = 0;
  Interval live;
  std::vector<TensorId> members;  // in order of birth
  uint64_t offset = 0;
};

// Free holes of one tier's arena, coalesced; [offset, offset + size).
class FreeList {
 public:
  // Best fit: the smallest hole that holds `size`; else the top (extending a hole that ends there).
  uint64_t take(uint64_t size) {
    auto best = holes_.end();
    for (auto it = holes_.begin(); it != holes_.end(); ++it)
      if (it->second >= size && (best == holes_.end() || it->second < best->second)) best = it;
    if (best != holes_.end()) {
      const uint64_t off = best->first, hole = best->second;
      holes_.erase(best);
      if (hole > size) holes_[off + size] = hole - size;
      return off;
    }
    uint64_t off = top_;
    if (!holes_.empty()) {
      auto last = std::prev(holes_.end());
      if (last->first + last->second == top_) {
        off = last->first;
        holes_.erase(last);
      }
    }
    top_ = off + size;
    return off;
  }
  void give(uint64_t off, uint64_t size) {
    auto next = holes_.lower_bound(off);
    if (next != holes_.end() && next->first == off + size) {
      size += next->second;
      next = holes_.erase(next);
    }
    if (next != holes_.begin()) {
      auto prev = std::prev(next);
      if (prev->first + prev->second == off) {
        prev->second += size;
        return;
      }
    }
    holes_[off] = size;
  }
  void set_top(uint64_t top) { top_ = top; }

 private:
  std::map<uint64_t, uint64_t> holes_;
  uint64_t top_ = 0;
};

std::vector<Buffer> form_buffers(const Program& p, const std::vector<Interval>& live, std::vector<int>& buffer_of) {
  std::vector<Buffer> buffers;
  buffer_of.assign(p.tensors().size(), -1);
  auto new_buffer = [&](TensorId root) {
    const TensorDesc& t = p.tensor(root);
    Buffer b;
    b.tier = t.tier;
    b.persistent = t.lifetime == Lifetime::persistent;
    b.bytes = t.bytes();
    b.live = live[size_t(root)];
    b.members = {root};
    buffer_of[size_t(root)] = int(buffers.size());
    buffers.push_back(std::move(b));
  };
  // Roots in order of birth, so that an in-place output finds its input's buffer formed.
  std::vector<TensorId> roots;
  for (size_t id = 0; id < p.tensors().size(); ++id) {
    const TensorDesc& t = p.tensors()[id];
    if (t.is_view()) continue;
    if (!live[id].used()) {
      MEMFIT_CHECK(t.lifetime == Lifetime::persistent, "plan", "tensor '{}' is never used by any op", t.name);
      continue;
    }
    roots.push_back(TensorId(id));
  }
  std::stable_sort(roots.begin(), roots.end(),
                   [&](TensorId a, TensorId b) { return live[size_t(a)].first < live[size_t(b)].first; });
  // Output root -> input root it may replace in place.
  std::map<TensorId, TensorId> replaces;
  std::vector<char> claimed(p.tensors().size(), 0);
  for (int i = 0; i < int(p.ops().size()); ++i) {
    const Op& op = p.op(i);
    for (auto [o, in] : op.inplace) {
      const TensorId out = op.outputs[size_t(o)], src = op.inputs[size_t(in)];
      if (out == kNoTensor || p.tensor(out).is_view() || p.tensor(src).is_view()) continue;
      const TensorDesc &to = p.tensor(out), &ts = p.tensor(src);
      if (to.lifetime != Lifetime::transient || ts.lifetime != Lifetime::transient || to.tier != ts.tier) continue;
      if (live[size_t(src)].last != i || live[size_t(out)].first != i || claimed[size_t(src)] || replaces.count(out))
        continue;
      if (std::count(op.inputs.begin(), op.inputs.end(), src) != 1) continue;
      replaces[out] = src;
      claimed[size_t(src)] = 1;
    }
  }
  for (TensorId r : roots) {
    auto it = replaces.find(r);
    const int host = it == replaces.end() ? -1 : buffer_of[size_t(it->second)];
    if (host >= 0 && p.tensor(r).bytes() <= buffers[size_t(host)].bytes) {
      Buffer& b = buffers[size_t(host)];
      b.members.push_back(r);
      b.live.last = std::max(b.live.last, live[size_t(r)].last);
      buffer_of[size_t(r)] = host;
    } else {
      new_buffer(r);
    }
  }
  return buffers;
}

// No offset the placement computes exceeds the sum of its tier's aligned buffer sizes, so
// checking those sums once makes every offset, end and peak below exact.
void check_tier_sums(const std::vector<Buffer>& buffers, const TierAlignments& alignments) {
  std::array<uint64_t, kNumTiers> sum{};
  constexpr std::string_view what = "bytes of one tier's buffers";
  for (const Buffer& b : buffers)
    sum[size_t(b.tier)] = checked_add(sum[size_t(b.tier)], checked_align_up(b.bytes, alignments[size_t(b.tier)], what, "plan"),
                                      what, "plan");
}

// Places the buffers of one tier; returns the plan's per-tier numbers except the timeline.
void place_tier(Tier tier, uint64_t alignment, std::vector<Buffer>& buffers, int n_ops, TierPlan& out) {
  uint64_t top = 0;
  for (Buffer& b : buffers) {
    if (b.tier != tier || !b.persistent) continue;
    b.offset = top;
    top = align_up(top + b.bytes, alignment);
  }
  uint64_t peak = 0;
  for (const Buffer& b : buffers)
    if (b.tier == tier && b.persistent) peak = std::max(peak, b.offset + b.bytes);
  out.peak_op = peak > 0 ? 0 : -1;

  FreeList free;
  free.set_top(top);
  std::vector<std::vector<int>> born(static_cast<size_t>(n_ops)), dies(static_cast<size_t>(n_ops));
  for (int i = 0; i < int(buffers.size()); ++i) {
    const Buffer& b = buffers[size_t(i)];
    if (b.tier != tier || b.persistent) continue;
    born[size_t(b.live.first)].push_back(i);
    dies[size_t(b.live.last)].push_back(i);
  }
  for (int op = 0; op < n_ops; ++op) {
    if (op > 0)
      for (int i : dies[size_t(op - 1)])
        free.give(buffers[size_t(i)].offset, align_up(buffers[size_t(i)].bytes, alignment));
    std::vector<int>& now = born[size_t(op)];
    std::stable_sort(now.begin(), now.end(), [&](int a, int b) { return buffers[size_t(a)].bytes > buffers[size_t(b)].bytes; });
    for (int i : now) {
      Buffer& b = buffers[size_t(i)];
      b.offset = free.take(align_up(b.bytes, alignment));
      if (b.offset + b.bytes > peak) {
        peak = b.offset + b.bytes;
        out.peak_op = op;
      }
    }
  }
  out.peak_bytes = peak;
}

// Timeline: bytes of each live buffer, attributed to the category of the member that holds
// the buffer at that op (the newest one born by then). Buffers add their bytes as differences
// at the op where they (or a member) start and after the op where they end, summed once over
// the ops: O(ops x categories + buffers), where adding each buffer's bytes op by op cost
// O(buffers x ops) (persistent buffers span every op: quadratic in the layer count).
void fill_timeline(const Program& p, const std::vector<Interval>& live, const std::vector<Buffer>& buffers, int n_ops,
                   MemoryPlan& plan) {
  // delta[tier][op][category]: change of the live bytes from op - 1 to op (unsigned arithmetic
  // wraps in between, and the running sums are exact because every true total fits).
  std::array<std::vector<CategoryBytes>, kNumTiers> delta;
  for (auto& d : delta) d.assign(size_t(n_ops) + 1, CategoryBytes{});
  for (const Buffer& b : buffers) {
    auto& d = delta[size_t(b.tier)];
    size_t category = size_t(p.tensor(b.members[0]).category);
    d[size_t(b.live.first)][category] += b.bytes;
    for (size_t m = 1; m < b.members.size(); ++m) {
      const size_t next = size_t(p.tensor(b.members[m]).category);
      const size_t at = size_t(std::max(b.live.first, live[size_t(b.members[m])].first));
      d[at][category] -= b.bytes;
      d[at][next] += b.bytes;
      category = next;
    }
    d[size_t(b.live.last) + 1][category] -= b.bytes;
  }
  for (size_t t = 0; t < size_t(kNumTiers); ++t) {
    TierPlan& tp = plan.tiers[t];
    tp.live_bytes.assign(size_t(n_ops), 0);
    tp.live_by_category.assign(size_t(n_ops), CategoryBytes{});
    CategoryBytes running{};
    for (size_t op = 0; op < size_t(n_ops); ++op) {
      uint64_t total = 0;
      for (size_t c = 0; c < size_t(kNumCategories); ++c) total += (running[c] += delta[t][op][c]);
      tp.live_by_category[op] = running;
      tp.live_bytes[op] = total;
    }
  }
}

}  // namespace

MemoryPlan plan_memory(const Program& p, const TierAlignments& alignments) {
  for (Tier tier : kAllTiers) {
    const uint64_t a = alignments[size_t(tier)];
    MEMFIT_CHECK(a > 0 && (a & (a - 1)) == 0, "plan", "the {} tier's alignment {} is not a power of two", tier_name(tier), a);
  }
  const std::vector<Interval> live = compute_liveness(p);
  std::vector<int> buffer_of;
  std::vector<Buffer> buffers = form_buffers(p, live, buffer_of);
  const int n_ops = int(p.ops().size());

  MemoryPlan plan;
  plan.alignments = alignments;
  check_tier_sums(buffers, alignments);
  for (Tier tier : kAllTiers) {
    TierPlan& tp = plan.tiers[size_t(tier)];
    place_tier(tier, alignments[size_t(tier)], buffers, n_ops, tp);
    MEMFIT_CHECK(tp.peak_bytes <= kMaxTierBytes, "plan", "the {} tier needs {} ({} bytes), above {}, more than any "
                 "machine has in one memory tier", tier_name(tier), format_bytes(tp.peak_bytes), tp.peak_bytes,
                 format_bytes(kMaxTierBytes));
  }

  plan.tensors.resize(p.tensors().size());
  for (size_t id = 0; id < p.tensors().size(); ++id) {
    const TensorDesc& t = p.tensors()[id];
    TensorPlacement& pl = plan.tensors[id];
    const TensorId root = p.root_of(TensorId(id));
    pl.tier = t.tier;
    pl.bytes = t.bytes();
    pl.live = live[id];
    pl.buffer = buffer_of[size_t(root)];
    if (pl.buffer >= 0) pl.offset = buffers[size_t(pl.buffer)].offset + (t.is_view() ? t.view_offset : 0);
  }

  fill_timeline(p, live, buffers, n_ops, plan);
  for (TierPlan& tp : plan.tiers) {
    for (int op = 0; op < n_ops; ++op) {
      if (tp.live_bytes[size_t(op)] > tp.max_live_bytes || tp.max_live_op < 0) {
        tp.max_live_bytes = tp.live_bytes[size_t(op)];
        tp.max_live_op = op;
      }
    }
    if (tp.peak_op >= 0) {
      tp.at_peak = tp.live_by_category[size_t(tp.peak_op)];
      tp.free_at_peak = tp.peak_bytes - std::min(tp.peak_bytes, tp.live_bytes[size_t(tp.peak_op)]);
    }
    if (tp.peak_bytes == 0) tp.max_live_op = -1;
  }
  return plan;
}

std::string find_overlap(const Program& p, const MemoryPlan& plan) {
  struct Item {
    TensorId id;
    const TensorPlacement* pl;
  };
  for (Tier tier : kAllTiers) {
    std::vector<Item> items;
    for (size_t id = 0; id < p.tensors().size(); ++id) {
      const TensorPlacement& pl = plan.tensors[id];
      if (pl.tier == tier && pl.buffer >= 0 && !p.tensors()[id].is_view() && pl.bytes > 0)
        items.push_back({TensorId(id), &pl});
    }
    std::sort(items.begin(), items.end(), [](const Item& a, const Item& b) { return a.pl->offset < b.pl->offset; });
    for (size_t i = 0; i < items.size(); ++i) {
      for (size_t j = i + 1; j < items.size() && items[j].pl->offset < items[i].pl->offset + items[i].pl->bytes; ++j) {
        const TensorPlacement &a = *items[i].pl, &b = *items[j].pl;
        const bool same_buffer = a.buffer == b.buffer;
        const bool time_overlap = a.live.first <= b.live.last && b.live.first <= a.live.last;
        // In-place members of one buffer meet at exactly one op: the one that replaces the other.
        const bool handover = same_buffer && (a.live.last == b.live.first || b.live.last == a.live.first);
        if (time_overlap && !handover)
          return fmt::format("'{}' [{}, +{}) ops {}..{} overlaps '{}' [{}, +{}) ops {}..{}", p.tensor(items[i].id).name,
                             a.offset, a.bytes, a.live.first, a.live.last, p.tensor(items[j].id).name, b.offset,
                             b.bytes, b.live.first, b.live.last);
      }
    }
  }
  return {};
}

}  // namespace memfit
