// Trace of a run: one record per executed op (program index, step, micro-step, start and end
// time, and optionally two measurements of the real memory), kept in a buffer sized before
// the first step, so recording allocates nothing; records past the capacity are counted and
// dropped. chrome_trace() turns the records and the plan into trace-event JSON (Perfetto,
// chrome://tracing): a slice per op with its phase and layer, a slice per step, and counter
// tracks sampled at each op's start: live bytes per category (planned and measured) and per
// tier, and the arena top (planned and measured); asynchronous transfers get a track per queue
// (transfer.out, transfer.in), a slice from each start to its wait with the bytes it moved.
// The measurements, taken right after the op ran and before the buffers that died there are
// returned to the sentinel (a DeadBufferFill added after the recorder does that):
//   * arena top: the highest byte of each arena that differs from the sentinel;
//   * live bytes per category (device tier): the buffers the plan says are live at the op
//     that hold anything but the sentinel, each counted whole once any byte of it does (a
//     live buffer holding only the sentinel has not been written yet).
// Subtle point: counters say what holds while the op runs, so the value at an op's start is
// that op's entry of the plan's timeline and the scans taken right after it.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <span>
#include <vector>

#include <nlohmann/json.hpp>

#include "plan/memory_plan.hpp"
#include "runtime/executor.hpp"

namespace memfit {

using TierTops = std::array<uint64_t, kNumTiers>;

struct TraceEvent {
  int32_t op = -1;
  int32_t step = 0;
  int32_t micro = 0;
  double begin = 0, end = 0;  // seconds since the recorder was made
  TierTops measured_top{};    // zeros when not measured
  CategoryBytes measured_live{};  // device tier; zeros when not measured
};

class TraceRecorder : public OpObserver {
 public:
  // measure: the executor whose memory is scanned after every op (the tops are noted in its
  // arenas, so their high-water marks survive the fill), or null. Measuring means something
  // when a DeadBufferFill with the sentinel is added to the executor after the recorder.
  TraceRecorder(size_t capacity, Executor* measure);

  void before_op(int op, const StepContext& ctx) override;
  void after_op(int op, const StepContext& ctx) override;

  std::span<const TraceEvent> events() const { return {events_.data(), size_}; }
  uint64_t dropped() const { return dropped_; }
  bool measures_tops() const { return measure_ != nullptr; }

 private:
  using Clock = std::chrono::steady_clock;
  std::vector<TraceEvent> events_;
  size_t size_ = 0;
  uint64_t dropped_ = 0;
  Executor* measure_;
  struct LiveRange {
    uint64_t offset, bytes;
    Category category;
  };
  std::vector<LiveRange> persistent_;               // device buffers live at every op
  std::vector<std::vector<LiveRange>> transient_;   // per op: device transient buffers live there
  Clock::time_point origin_;
  double op_begin_ = 0;
};

// The trace-event JSON object {"traceEvents": [...], "displayTimeUnit": "ms", "otherData": {...}}.
// other_data is merged into otherData (model, policy, what "measured" means).
nlohmann::json chrome_trace(const Program& program, const MemoryPlan& plan, std::span<const TraceEvent> events,
                            bool measured_tops, const nlohmann::json& other_data);

// Counter names used in the trace (tests look them up).
inline constexpr const char* kTraceLiveCounter = "planned live bytes";     // + " (" tier ")", args per category
inline constexpr const char* kTraceTierCounter = "planned live bytes per tier";  // args per tier
inline constexpr const char* kTracePlannedTop = "planned arena top";       // args per tier
inline constexpr const char* kTraceMeasuredTop = "measured arena top";     // args per tier
inline constexpr const char* kTraceMeasuredLive = "measured live bytes (device)";  // args per category

}  // namespace memfit
