// The last third of a training run: measure (the arena's high-water marks against the plan,
// on every rank; RSS; time per phase), refuse a non-finite state, save the weights (--save),
// build the report (the object `--report-json` writes) and write it atomically.
// Invariant: nothing is written from a state holding inf or NaN, and the report file either
// appears whole or not at all.
#pragma once

#include <nlohmann/json.hpp>

#include "train/run_setup.hpp"
#include "train/train_loop.hpp"

namespace memfit {

nlohmann::json finish_run(RunState& state, const LoopRecord& record, RunHooks* hooks);

}  // namespace memfit
