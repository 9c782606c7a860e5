#include "runtime/trace.hpp"

#include <map>
#include <string>

#include "plan/buffers.hpp"

namespace memfit {

TraceRecorder::TraceRecorder(size_t capacity, Executor* measure)
    : events_(capacity), measure_(measure), origin_(Clock::now()) {
  if (!measure_) return;
  const Program& p = measure_->program();
  const MemoryPlan& plan = measure_->plan();
  transient_.resize(p.ops().size());
  for (const PlannedBuffer& b : planned_buffers(p, plan)) {
    if (b.tier != Tier::device) continue;
    if (b.persistent) {
      persistent_.push_back({b.offset, b.bytes, p.tensor(b.members.front()).category});
      continue;
    }
    for (int op = b.live.first; op <= b.live.last; ++op)
      transient_[size_t(op)].push_back({b.offset, b.bytes, p.tensor(buffer_holder(b, plan, op)).category});
  }
}

namespace {

bool holds_data(const std::byte* base, uint64_t offset, uint64_t bytes) {
  const auto* b = reinterpret_cast<const unsigned char*>(base) + offset;
  for (uint64_t i = 0; i < bytes; ++i)
    if (b[i] != Arena::kSentinel) return true;  // nearly always the first byte
  return false;
}

}  // namespace

void TraceRecorder::before_op(int, const StepContext&) {
  op_begin_ = std::chrono::duration<double>(Clock::now() - origin_).count();
}

void TraceRecorder::after_op(int op, const StepContext& ctx) {
  const double end = std::chrono::duration<double>(Clock::now() - origin_).count();
  TierTops tops{};
  CategoryBytes live{};
  if (measure_) {
    for (Tier t : kAllTiers) {
      // A disk tier has no sentinel to scan: its highest byte written is its top.
      if (!measure_->buffer(t).host_data() && measure_->buffer(t).size() > 0) {
        tops[size_t(t)] = measure_->buffer(t).measured_high_water();
        continue;
      }
      Arena& a = measure_->arena(t);
      tops[size_t(t)] = a.scan_top();
      a.note_top(tops[size_t(t)]);
    }
    const std::byte* base = measure_->arena(Tier::device).data();
    for (const LiveRange& r : persistent_)
      if (holds_data(base, r.offset, r.bytes)) live[size_t(r.category)] += r.bytes;
    for (const LiveRange& r : transient_[size_t(op)])
      if (holds_data(base, r.offset, r.bytes)) live[size_t(r.category)] += r.bytes;
  }
  if (size_ == events_.size()) {
    ++dropped_;
    return;
  }
  TraceEvent& e = events_[size_++];
  e.op = op;
  e.step = int32_t(ctx.step);
  e.micro = ctx.micro;
  e.begin = op_begin_;
  e.end = end;
  e.measured_top = tops;
  e.measured_live = live;
}

namespace {

constexpr int kPid = 1, kOpsTid = 1, kStepsTid = 2, kTransferOutTid = 3, kTransferInTid = 4;

nlohmann::json metadata(const char* what, int tid, const std::string& name) {
  nlohmann::json e = {{"ph", "M"}, {"name", what}, {"pid", kPid}, {"args", {{"name", name}}}};
  if (tid > 0) e["tid"] = tid;
  return e;
}

nlohmann::json counter(const std::string& name, double ts, nlohmann::json args) {
  return {{"ph", "C"}, {"name", name}, {"pid", kPid}, {"ts", ts}, {"args", std::move(args)}};
}

// Asynchronous transfers on their own tracks (one per queue): a slice from the start op's
// begin to its wait's end, the longest the bytes can have been in flight, with their size and
// the rate that span implies (a lower bound on the worker's own rate).
void add_transfer_slices(const Program& p, std::span<const TraceEvent> events, nlohmann::json& out) {
  std::map<int, int> start_of;  // async id -> op index of its start
  for (int i = 0; i < int(p.ops().size()); ++i)
    if (p.op(i).kind == OpKind::transfer && p.op(i).async_id >= 0) start_of[p.op(i).async_id] = i;
  if (start_of.empty()) return;
  out.push_back(metadata("thread_name", kTransferOutTid, "transfer.out"));
  out.push_back(metadata("thread_name", kTransferInTid, "transfer.in"));
  std::map<int, double> began;  // start op -> its latest begin
  for (const TraceEvent& e : events) {
    const Op& op = p.op(e.op);
    if (op.kind == OpKind::transfer && op.async_id >= 0) began[e.op] = e.begin;
    if (op.kind != OpKind::wait || !start_of.count(op.async_id)) continue;
    const int start = start_of.at(op.async_id);
    const auto it = began.find(start);
    if (it == began.end()) continue;
    const Op& t = p.op(start);
    const uint64_t bytes = p.tensor(t.inputs[0]).bytes();
    const double seconds = e.end - it->second;
    out.push_back({{"ph", "X"}, {"name", t.name}, {"cat", "in flight"}, {"pid", kPid},
                   {"tid", t.queue == Queue::transfer_out ? kTransferOutTid : kTransferInTid},
                   {"ts", it->second * 1e6}, {"dur", seconds * 1e6},
                   {"args", {{"bytes", bytes}, {"GB/s over start..wait", seconds > 0 ? double(bytes) / seconds / 1e9 : 0.0},
                             {"from", tier_name(p.tensor(t.inputs[0]).tier)}, {"to", tier_name(p.tensor(t.outputs[0]).tier)}}}});
  }
}

}  // namespace

nlohmann::json chrome_trace(const Program& p, const MemoryPlan& plan, std::span<const TraceEvent> events,
                            bool measured_tops, const nlohmann::json& other_data) {
  const int n_ops = int(p.ops().size());
  const std::vector<PlannedBuffer> buffers = planned_buffers(p, plan);
  std::array<std::vector<uint64_t>, kNumTiers> top;
  std::vector<Tier> tiers;  // tiers the plan uses
  std::array<std::vector<Category>, kNumTiers> cats;  // categories each tier ever holds
  for (Tier t : kAllTiers) {
    const TierPlan& tp = plan.tier(t);
    if (tp.peak_bytes == 0 && t != Tier::device) continue;
    tiers.push_back(t);
    top[size_t(t)] = planned_arena_top(buffers, t, n_ops);
    for (Category c : kAllCategories) {
      bool any = false;
      for (const CategoryBytes& cb : tp.live_by_category) any = any || cb[size_t(c)] > 0;
      if (any) cats[size_t(t)].push_back(c);
    }
  }

  nlohmann::json out = nlohmann::json::array();
  out.push_back(metadata("process_name", 0, "memfit"));
  out.push_back(metadata("thread_name", kOpsTid, "ops"));
  out.push_back(metadata("thread_name", kStepsTid, "steps"));
  // Step slices: consecutive records of one optimizer step (its micro, sync and optimizer
  // sections), or of one validation pass.
  auto group_of = [&](const TraceEvent& e) {
    const int s = p.section_of_op(e.op);
    if (s < 0) return std::string("other");
    const SectionKind kind = p.sections()[size_t(s)].kind;
    return kind == SectionKind::eval ? std::string(section_name(kind)) : "step " + std::to_string(e.step);
  };
  for (size_t i = 0; i < events.size();) {
    const std::string g = group_of(events[i]);
    size_t j = i + 1;
    while (j < events.size() && group_of(events[j]) == g) ++j;
    out.push_back({{"ph", "X"}, {"name", g}, {"cat", "step"}, {"pid", kPid}, {"tid", kStepsTid},
                   {"ts", events[i].begin * 1e6}, {"dur", (events[j - 1].end - events[i].begin) * 1e6},
                   {"args", {{"ops", j - i}}}});
    i = j;
  }
  for (const TraceEvent& e : events) {
    const Op& op = p.op(e.op);
    const double ts = e.begin * 1e6;
    const int s = p.section_of_op(e.op);
    nlohmann::json args = {{"op", e.op},
                           {"kind", op_kind_name(op.kind)},
                           {"phase", phase_name(op.phase)},
                           {"layer", op.layer},
                           {"section", s >= 0 ? section_name(p.sections()[size_t(s)].kind) : ""},
                           {"step", e.step},
                           {"micro", e.micro},
                           {"planned_live_bytes", plan.tier(Tier::device).live_bytes[size_t(e.op)]}};
    out.push_back({{"ph", "X"}, {"name", op.name}, {"cat", phase_name(op.phase)}, {"pid", kPid}, {"tid", kOpsTid},
                   {"ts", ts}, {"dur", (e.end - e.begin) * 1e6}, {"args", std::move(args)}});
    nlohmann::json per_tier = nlohmann::json::object(), planned_top = nlohmann::json::object(),
                   measured = nlohmann::json::object();
    for (Tier t : tiers) {
      const TierPlan& tp = plan.tier(t);
      nlohmann::json by_cat = nlohmann::json::object();
      for (Category c : cats[size_t(t)]) by_cat[std::string(category_name(c))] = tp.live_by_category[size_t(e.op)][size_t(c)];
      out.push_back(counter(std::string(kTraceLiveCounter) + " (" + std::string(tier_name(t)) + ")", ts, std::move(by_cat)));
      per_tier[std::string(tier_name(t))] = tp.live_bytes[size_t(e.op)];
      planned_top[std::string(tier_name(t))] = top[size_t(t)][size_t(e.op)];
      measured[std::string(tier_name(t))] = e.measured_top[size_t(t)];
    }
    out.push_back(counter(kTraceTierCounter, ts, std::move(per_tier)));
    out.push_back(counter(kTracePlannedTop, ts, std::move(planned_top)));
    if (measured_tops) {
      out.push_back(counter(kTraceMeasuredTop, ts, std::move(measured)));
      nlohmann::json by_cat = nlohmann::json::object();
      for (Category c : cats[size_t(Tier::device)])
        by_cat[std::string(category_name(c))] = e.measured_live[size_t(c)];
      out.push_back(counter(kTraceMeasuredLive, ts, std::move(by_cat)));
    }
  }
  add_transfer_slices(p, events, out);
  nlohmann::json other = other_data.is_object() ? other_data : nlohmann::json::object();
  other["measured arena top"] =
      measured_tops
          ? "after each op, the arena is scanned for its highest byte that differs from the start-up sentinel; "
            "buffers whose planned interval ended at that op are then returned to the sentinel, so the scan "
            "shows how far up the arena holds live data (bytes of a live tensor that equal the sentinel, or "
            "that its op has not written, can make it lower than planned)"
          : "not measured";
  other["measured live bytes"] =
      measured_tops
          ? "after each op, the buffers the plan says are live there that hold anything but the sentinel, each "
            "counted whole, per category of the tensor holding it (device tier); lower than planned where a live "
            "buffer has not been written yet"
          : "not measured";
  return {{"traceEvents", std::move(out)}, {"displayTimeUnit", "ms"}, {"otherData", std::move(other)}};
}

}  // namespace memfit
