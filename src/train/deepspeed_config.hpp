// DeepSpeed configuration files as people write them, and as the HF Trainer writes them ("auto"
// values). Every documented key of a feature memfit has is accepted and means what it means in
// DeepSpeed; a key, or a value, that asks for something memfit cannot do is refused in one line
// naming the key; nothing is silently ignored, inside nested blocks included. "auto" leaves the
// setting to memfit's flags and defaults, which is what the HF Trainer does with it.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "train/run_config.hpp"

namespace memfit {

class Program;

// Applies one top-level key of a config file when it is one of DeepSpeed's; returns false when
// it is not (the caller then tries memfit's own keys). Throws [config] naming the key.
bool apply_deepspeed_key(const std::string& key, const nlohmann::json& value, RunConfig& config);

// DeepSpeed's batch rule: train_batch_size = micro-batch x accumulation x data-parallel ranks;
// any two of the three determine the third, and all three must agree. --batch and --grad-accum
// win over the file's keys; `note` says what the flags replaced (empty when nothing). Throws
// [config] when the keys disagree or do not divide.
void resolve_batch_keys(RunConfig& config, int data_parallel, std::string& note);

// The bucket and buffer bounds of the zero_optimization block against the program: memfit's
// ZeRO buckets hold whole layers, so a bound below the largest layer cannot be honoured and is
// refused naming the key and both sizes.
void check_deepspeed_bounds(const RunConfig& config, const Program& program);

}  // namespace memfit
