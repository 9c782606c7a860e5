// `memfit plan` on hardware this machine is not: --hardware, --gpus-per-node, --nodes or
// --world-size, ZeRO and offload policies, --fit, --compare and --emit; and --framework pytorch|deepspeed
// (the same step's peak in HF transformers + PyTorch or DeepSpeed, fit/framework_pytorch.hpp,
// fit/framework_deepspeed.hpp). Registered on the plan
// subcommand next to RunOptions; main.cpp hands the run to it when any of these is given.
#pragma once

#include <iosfwd>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <CLI/CLI.hpp>

#include <nlohmann/json.hpp>

#include "fit/estimate.hpp"
#include "fit/hardware.hpp"
#include "train/run_config.hpp"

namespace memfit::cli {

class HardwarePlanOptions {
 public:
  explicit HardwarePlanOptions(CLI::App& plan);
  // True when the run needs the estimate: other hardware, --fit, --compare, --emit. Offload
  // (optimizer and parameters) is a program transformation: plan builds it. A ZeRO run on this machine's backend (only
  // --world-size / --zero given) gets plan's full memory table of rank 0's program; the
  // estimate plans the same program (fit/estimate.hpp), so both report the same peak.
  bool requested(const RunConfig& config) const;
  // --world-size when given (0 otherwise), for the real per-rank program.
  int world_size() const { return world_size_; }
  int run(const RunConfig& config, bool as_json, std::ostream& out) const;
  // Refuses, in one line, what a tensor-parallel plan cannot do yet (--fit, --compare, ...);
  // called before run().
  void check_tensor_parallel_plan(int tensor) const;

 private:
  std::pair<Policy, int> fit_winner(const ModelSpec& spec, const RunConfig& config, const Policy& policy,
                                    const Cluster& cluster, const EstimateOptions& eo, uint64_t budget, double headroom,
                                    bool as_json, nlohmann::json& j, std::ostream& out) const;
  // The preset with --hardware-file, --hardware-set and --device-memory applied (not measured);
  // `given` collects the fields the user set.
  Hardware chosen_hardware(std::set<std::string>& given) const;

  CLI::App& app_;
  std::string hardware_ = "cpu", hardware_file_;
  std::vector<std::string> sets_;
  std::string device_memory_;
  int gpus_per_node_ = 0, nodes_ = 0, world_size_ = 0;
  double efficiency_ = 0, comm_overlap_ = 0;  // efficiency 0: the hardware's default
  double headroom_ = 0.05;                    // share of the budget a plan leaves free
  bool fit_ = false, compare_ = false;
  std::string framework_ = "memfit", torch_attention_ = "sdpa";  // --framework, --torch-attention
  std::string deepspeed_config_;                                  // --deepspeed-config
  int64_t global_batch_ = 0, max_batch_ = 64;
  int keep_ = 5;
  std::vector<std::string> emit_;
};

}  // namespace memfit::cli
