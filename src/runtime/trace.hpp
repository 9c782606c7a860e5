// Trace of a run: one record per executed op (program index, step, micro-step, start and end
// time, and optionally the measured arena tops), kept in a buffer
// sized before the first step, so recording allocates nothing; records past the capacity are
// counted and dropped. chrome_trace() turns the records and the plan into trace-event JSON
// (Perfetto, chrome://tracing): a slice per op with its phase and layer, a slice per step,
// and counter tracks of the planned live bytes per category and per tier and the planned and
// measured arena tops, all sampled at each op's start.
// Subtle point: counters say what holds while the op runs, so the value at an op's start is
// that op's entry of the plan's timeline, and the measured top is the scan taken right after
// it ran (before the buffers that died there are filled).
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <span>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/executor.hpp"

namespace memfit {

using TierTops = std::array<uint64_t, kNumTiers>;

struct TraceEvent {
  int32_t op = -1;
  int32_t step = 0;
  int32_t micro = 0;
  double begin = 0, end = 0;  // seconds since the recorder was made
  TierTops measured_top{};    // zeros when not measured
};

class TraceRecorder : public OpObserver {
 public:
  // measure: the executor whose arena tops are scanned after every op (and noted in the
  // arenas), or null. Measuring means something when a DeadBufferFill with the sentinel is
  // added to the executor after the recorder: then the scan sees live data only.
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

}  // namespace memfit
