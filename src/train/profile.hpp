// `memfit profile`: a short training run (the flags of `memfit train`) watched op by op. It
// writes into an output directory
//   trace.json   Chrome trace-event JSON (Perfetto, chrome://tracing): a slice per op with its
//                phase and layer, counters of planned live bytes per category and tier and the
//                planned and measured arena tops (runtime/trace.hpp);
//   report.html  one self-contained page (inline SVG and script, no network): the memory
//                timeline stacked by category with the peak marked, the largest tensors live
//                at the peak, the per-layer breakdown, plan vs measurement;
// and prints the same summary as text.
// "Measured" here: after each op the arena is scanned for its highest byte that differs from
// the start-up sentinel, the buffers the plan says are live are checked for data, and then
// buffers whose planned interval ended at that op are returned to the sentinel
// (runtime/dead_buffers.hpp, runtime/trace.hpp). The scans therefore see how far up the arena
// really holds live data at every op, and which live bytes hold data, per category; the
// top's maximum is the run's high-water mark.
#pragma once

#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "train/run_config.hpp"
#include "train/run_hooks.hpp"

namespace memfit {

class DeadBufferFill;
class TraceRecorder;

class ProfileHooks : public RunHooks {
 public:
  ProfileHooks(const RunConfig& config, std::string out_dir);
  ~ProfileHooks() override;

  void before_steps(Executor& executor, const PreparedRun& run) override;
  void after_run(Executor& executor, nlohmann::json& report, std::ostream& log) override;

  const std::string& trace_path() const { return trace_path_; }
  const std::string& html_path() const { return html_path_; }

 private:
  RunConfig config_;
  std::string out_dir_, trace_path_, html_path_;
  const PreparedRun* run_ = nullptr;
  std::unique_ptr<DeadBufferFill> fill_;
  std::unique_ptr<TraceRecorder> recorder_;
};

// The page, from the data object ProfileHooks assembles (exposed for tests).
std::string profile_html(const nlohmann::json& data);

}  // namespace memfit
