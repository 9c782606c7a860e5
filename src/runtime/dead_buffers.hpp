// Dead-buffer fill: after each op, the bytes of every buffer whose planned interval ended at
// that op are overwritten with a fill byte. Two uses:
//   * leak guard (kPoison = 0xFF: NaN in fp32, bf16 and fp16, -1 in integers): nothing can
//     read a value after the plan says it is dead without the result changing, so a run with
//     the fill must give bitwise the results of a run without it;
//   * profile (Arena::kSentinel): dead bytes look unused again, so a scan of the arena after
//     each op (TraceRecorder, added to the executor before this observer) measures how far up
//     it holds live data; the recorder notes each top in the arena, so the arena's high-water
//     mark still covers the whole run.
// Subtle point: in a repeated section (gradient accumulation) a buffer that enters the loop
// from before it ends its interval at the loop's last op but is read again by the next
// iteration; it is filled only after the last iteration.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "plan/buffers.hpp"
#include "runtime/executor.hpp"

namespace memfit {

class DeadBufferFill : public OpObserver {
 public:
  static constexpr unsigned char kPoison = 0xFF;

  DeadBufferFill(Executor& executor, unsigned char fill);

  void after_op(int op, const StepContext& ctx) override;

  uint64_t filled_bytes() const { return filled_bytes_; }
  unsigned char fill() const { return fill_; }

  // Between steps every transient buffer is dead, so each byte above the persistent buffers
  // must hold the fill byte or the sentinel (never written). Returns the first byte that holds
  // anything else (an op wrote memory no live tensor owned: past its outputs, into padding,
  // or into a buffer after its interval ended and before any later owner was born), naming
  // the buffers planned over that byte; empty when clean.
  std::string find_stray_bytes() const;

 private:
  struct Range {
    Tier tier;
    uint64_t offset, bytes;
    bool last_iteration_only;
  };
  Executor& ex_;
  unsigned char fill_;
  std::vector<PlannedBuffer> buffers_;
  std::vector<std::vector<Range>> dying_;  // per op
  std::array<uint64_t, kNumTiers> persistent_top_{};
  uint64_t filled_bytes_ = 0;
};

}  // namespace memfit
