// Dynamic loss scaling for fp16 training, in the two conventions users know:
//   pytorch    torch.amp.GradScaler: start at 2^16; an overflow halves the scale (backoff 0.5)
//              and restarts the count; after `growth_interval` (2000) clean steps in a row
//              the scale doubles.
//   deepspeed  DeepSpeed's DynamicLossScaler, configured by the fp16 config block:
//              start at 2^initial_scale_power (16); an overflow first uses up the hysteresis
//              (2): only when it is down to 1 does an overflow divide the scale by 2, never
//              below min_loss_scale; after `loss_scale_window` (1000) steps without an
//              overflow the scale doubles and the hysteresis is restored (with
//              consecutive_hysteresis, every clean step restores it).
// Either way an overflowing step is skipped (weights and optimizer state untouched). A fixed
// scale (fp16.loss_scale > 0) never changes.
//
// Subtle point, the floor: DeepSpeed stops a run whose scale is already at its minimum when
// another overflow comes; GradScaler has no minimum and would halve towards 0. memfit stops
// both (update() returns `exhausted`) once an overflow arrives at or below min_scale — and
// with a fixed scale at the first overflow — so that the trainer can say which op overflowed
// instead of training on nothing.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace memfit {

enum class LossScaleConvention : uint8_t { pytorch, deepspeed };
std::string_view loss_scale_convention_name(LossScaleConvention c);
LossScaleConvention parse_loss_scale_convention(std::string_view s);  // throws [config]

struct LossScaleConfig {
  LossScaleConvention convention = LossScaleConvention::pytorch;
  double fixed_scale = 0;       // > 0: static loss scale (DeepSpeed fp16.loss_scale)
  double initial_scale = 65536; // GradScaler init_scale; DeepSpeed 2^initial_scale_power
  int64_t window = 0;           // clean steps before growth; 0: the convention's (2000 / 1000)
  int hysteresis = 0;           // deepspeed: overflows tolerated before a cut; 0: 2
  bool consecutive_hysteresis = false;  // deepspeed
  double min_scale = 1;         // the floor (DeepSpeed min_loss_scale)
  // Throws [config] for a non-positive scale, window or hysteresis.
  void validate() const;
  int64_t resolved_window() const;
  int resolved_hysteresis() const;
};

class LossScaler {
 public:
  enum class Outcome { applied, skipped, exhausted };
  explicit LossScaler(const LossScaleConfig& config);

  float scale() const { return float(scale_); }
  // Records one step: `overflow` when its gradients held inf/NaN. Returns what to do with the
  // step; `exhausted` means the overflow came at the minimum scale and the run must stop.
  Outcome update(bool overflow);

  // The whole state, for checkpoints (and tests that need a given scale).
  struct State {
    double scale = 1;
    int64_t clean = 0, skipped = 0;
    int hysteresis = 1;
  };
  State state() const { return State{scale_, clean_, skipped_, hysteresis_}; }
  void restore(const State& s);

  int64_t skipped_steps() const { return skipped_; }
  int64_t clean_streak() const { return clean_; }  // clean steps since the last growth or overflow
  int hysteresis_left() const { return hysteresis_; }
  const LossScaleConfig& config() const { return config_; }

 private:
  LossScaleConfig config_;
  double scale_;
  int64_t clean_ = 0, skipped_ = 0;
  int hysteresis_;
};

}  // namespace memfit
