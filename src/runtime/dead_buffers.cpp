#include "runtime/dead_buffers.hpp"

#include <algorithm>
#include <cstring>

#include "core/bytes.hpp"
#include "core/error.hpp"

namespace memfit {

DeadBufferFill::DeadBufferFill(Executor& ex, unsigned char fill) : ex_(ex), fill_(fill) {
  const Program& p = ex.program();
  buffers_ = planned_buffers(p, ex.plan());
  dying_.resize(p.ops().size());
  for (const PlannedBuffer& b : buffers_) {
    if (b.persistent) {
      persistent_top_[size_t(b.tier)] = std::max(persistent_top_[size_t(b.tier)], b.offset + b.bytes);
      continue;
    }
    bool last_only = false;
    for (const Section& s : p.sections())
      if (s.repeat > 1 && b.live.last == s.end - 1 && b.live.first < s.begin) last_only = true;
    dying_[size_t(b.live.last)].push_back({b.tier, b.offset, b.bytes, last_only});
  }
}

void DeadBufferFill::after_op(int op, const StepContext& ctx) {
  const bool last_iteration = ctx.micro + 1 >= ctx.micro_count;
  for (const Range& r : dying_[size_t(op)]) {
    if (r.last_iteration_only && !last_iteration) continue;
    if (!ex_.buffer(r.tier).host_data()) continue;  // a disk tier: only transfers touch it
    std::memset(ex_.arena(r.tier).data() + r.offset, fill_, r.bytes);
    filled_bytes_ += r.bytes;
  }
}

namespace {

// First byte in [begin, end) holding neither a nor b; end when none. Whole words first.
uint64_t first_other_byte(const unsigned char* bytes, uint64_t begin, uint64_t end, unsigned char a, unsigned char b) {
  const uint64_t wa = 0x0101010101010101ull * a, wb = 0x0101010101010101ull * b;
  uint64_t i = begin;
  while (i < end && i % 8 != 0) {
    if (bytes[i] != a && bytes[i] != b) return i;
    ++i;
  }
  for (; i + 8 <= end; i += 8) {
    uint64_t w;
    std::memcpy(&w, bytes + i, 8);
    if (w != wa && w != wb) break;  // a mixed word falls through to the byte loop
  }
  for (; i < end; ++i)
    if (bytes[i] != a && bytes[i] != b) return i;
  return end;
}

}  // namespace

std::string DeadBufferFill::find_stray_bytes() const {
  const Program& p = ex_.program();
  for (Tier t : kAllTiers) {
    if (!ex_.buffer(t).host_data() && ex_.buffer(t).size() > 0) continue;  // no sentinel to scan
    const Arena& a = ex_.arena(t);
    const auto* bytes = reinterpret_cast<const unsigned char*>(a.data());
    const uint64_t i = first_other_byte(bytes, persistent_top_[size_t(t)], a.size(), fill_, Arena::kSentinel);
    if (i == a.size()) continue;
    std::string owners;
    for (const PlannedBuffer& b : buffers_) {
      if (b.tier != t || i < b.offset || i >= b.offset + b.bytes) continue;
      for (TensorId m : b.members)
        owners += fmt::format("{}'{}' (ops {}..{})", owners.empty() ? "" : ", ", p.tensor(m).name,
                              ex_.plan().tensors[size_t(m)].live.first, ex_.plan().tensors[size_t(m)].live.last);
    }
    return fmt::format("byte {} of the {} arena holds 0x{:02x} between steps; planned there: {}", i, tier_name(t),
                       bytes[i], owners.empty() ? "nothing (alignment padding)" : owners);
  }
  return {};
}

}  // namespace memfit
