#include "train/profile.hpp"

#include <sys/resource.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>

#include "core/bytes.hpp"
#include "core/checked.hpp"
#include "core/error.hpp"
#include "plan/breakdown.hpp"
#include "runtime/dead_buffers.hpp"
#include "runtime/trace.hpp"
#include "train/trainer.hpp"

namespace memfit {

namespace {

constexpr size_t kTopTensors = 20;
constexpr size_t kTopTensorsText = 8;

void write_text(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary);
    out << text;
    MEMFIT_CHECK(out.good(), "profile", "cannot write '{}'", path);
  }
  std::filesystem::rename(tmp, path);
}

std::string layer_name(int layer) { return layer < 0 ? "outside blocks" : fmt::format("layer {}", layer); }

// Per op: mean seconds over its executions, leaving out the first one (warm-up: oneDNN's
// kernel generation, first touches) when it ran more than once. -1 when it never ran.
std::vector<double> mean_op_seconds(int n_ops, std::span<const TraceEvent> events) {
  std::vector<double> sum(size_t(n_ops), 0.0), first(size_t(n_ops), -1.0);
  std::vector<int> count(size_t(n_ops), 0);
  for (const TraceEvent& e : events) {
    const double d = e.end - e.begin;
    if (count[size_t(e.op)]++ == 0) first[size_t(e.op)] = d;
    else sum[size_t(e.op)] += d;
  }
  std::vector<double> out(size_t(n_ops), -1.0);
  for (int i = 0; i < n_ops; ++i)
    out[size_t(i)] = count[size_t(i)] == 0 ? -1.0 : count[size_t(i)] == 1 ? first[size_t(i)] : sum[size_t(i)] / (count[size_t(i)] - 1);
  return out;
}

// Times an op runs per optimizer step (micro-steps x repeats, optimizer once, eval never).
int runs_per_step(const Program& p, int op) {
  const int s = p.section_of_op(op);
  if (s < 0) return 0;
  const Section& sec = p.sections()[size_t(s)];
  return sec.name == "micro" ? sec.repeat : sec.name == "optimizer" ? 1 : 0;
}

}  // namespace

ProfileHooks::ProfileHooks(const RunConfig& config, std::string out_dir)
    : config_(config), out_dir_(std::move(out_dir)) {
  MEMFIT_CHECK(!out_dir_.empty(), "profile", "--out needs a directory");
  std::error_code ec;
  std::filesystem::create_directories(out_dir_, ec);
  MEMFIT_CHECK(!ec && std::filesystem::is_directory(out_dir_), "profile", "cannot create the output directory '{}': {}",
               out_dir_, ec ? ec.message() : "not a directory");
  trace_path_ = out_dir_ + "/trace.json";
  html_path_ = out_dir_ + "/report.html";
}

ProfileHooks::~ProfileHooks() = default;

void ProfileHooks::before_steps(Executor& ex, const PreparedRun& run) {
  run_ = &run;
  const Program& p = run.compiled.program;
  size_t per_step = 0, eval_ops = 0;
  for (const Section& s : p.sections()) {
    const size_t n = size_t(s.end - s.begin);
    if (s.name == "eval") eval_ops = n;
    else per_step += n * size_t(s.repeat);
  }
  const int64_t evals = run.policy.with_eval
                            ? (config_.eval_every > 0 ? (config_.steps - 1) / config_.eval_every : 0) + 1
                            : 0;
  // The recorder keeps one record per executed op, allocated up front: bound it (checked) so
  // that a long run asks for fewer steps instead of for more memory than the machine has.
  constexpr uint64_t kMaxRecords = uint64_t(1) << 24;  // ~2 GiB of records
  const std::string what = "op records of the profile";
  const uint64_t capacity = checked_add(checked_mul(uint64_t(per_step), uint64_t(config_.steps), what, "profile"),
                                        checked_mul(uint64_t(eval_ops) * uint64_t(evals), uint64_t(config_.eval_batches),
                                                    what, "profile"),
                                        what, "profile");
  MEMFIT_CHECK(capacity <= kMaxRecords, "profile", "{} steps of {} ops are {} op records, above the {} a profile "
               "keeps; profile fewer --steps", config_.steps, per_step, capacity, kMaxRecords);
  // The recorder scans before the fill returns dead buffers to the sentinel.
  recorder_ = std::make_unique<TraceRecorder>(size_t(capacity), &ex);
  fill_ = std::make_unique<DeadBufferFill>(ex, Arena::kSentinel);
  ex.add_observer(recorder_.get());
  ex.add_observer(fill_.get());
}

void ProfileHooks::after_run(Executor& ex, nlohmann::json& report, std::ostream& log) {
  MEMFIT_ASSERT(run_ && recorder_, "profile hooks used before the steps");
  const Program& p = run_->compiled.program;
  const MemoryPlan& plan = run_->compiled.plan;
  const TierPlan& dev = plan.tier(Tier::device);
  const int n_ops = int(p.ops().size());
  const std::span<const TraceEvent> events = recorder_->events();
  const std::vector<PlannedBuffer> buffers = planned_buffers(p, plan);
  const std::vector<uint64_t> planned_top = planned_arena_top(buffers, Tier::device, n_ops);
  const std::vector<double> op_seconds = mean_op_seconds(n_ops, events);

  // Measured arena top and live bytes per op: its latest execution (steady state); and at how
  // many executions the live bytes per category equal the plan.
  std::vector<int64_t> measured_top(size_t(n_ops), -1), measured_live(size_t(n_ops), -1);
  size_t live_equal = 0;
  for (const TraceEvent& e : events) {
    measured_top[size_t(e.op)] = int64_t(e.measured_top[size_t(Tier::device)]);
    uint64_t total = 0;
    for (uint64_t b : e.measured_live) total += b;
    measured_live[size_t(e.op)] = int64_t(total);
    live_equal += e.measured_live == dev.live_by_category[size_t(e.op)];
  }
  int ran = 0, equal = 0, worst_op = -1;
  uint64_t worst_gap = 0;
  for (int i = 0; i < n_ops; ++i) {
    if (measured_top[size_t(i)] < 0) continue;
    ++ran;
    const uint64_t m = uint64_t(measured_top[size_t(i)]), pl = planned_top[size_t(i)];
    if (m == pl) ++equal;
    const uint64_t gap = m > pl ? m - pl : pl - m;
    if (gap > worst_gap) worst_gap = gap, worst_op = i;
  }
  const uint64_t measured_peak = ex.arena(Tier::device).measured_high_water();

  // Time per step, by phase and by layer.
  double step_seconds = 0;
  std::map<std::string, double> by_phase;
  std::map<int, double> layer_seconds;
  for (int i = 0; i < n_ops; ++i) {
    const double s = std::max(0.0, op_seconds[size_t(i)]) * runs_per_step(p, i);
    step_seconds += s;
    by_phase[std::string(phase_name(p.op(i).phase))] += s;
    layer_seconds[p.op(i).layer] += s;
  }

  const std::vector<LiveTensor> live = live_tensors_at(p, plan, buffers, Tier::device, dev.peak_op);
  const std::vector<LayerBytes> layers = bytes_by_layer(live);
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  const uint64_t max_rss = uint64_t(u.ru_maxrss) * 1024;

  nlohmann::json data;
  data["title"] = fmt::format("{}, batch {} x {}, accumulation {}, {}", run_->spec.name, run_->policy.batch,
                              run_->policy.seq, run_->policy.grad_accum, precision_name(run_->policy.precision));
  data["model"] = model_json(run_->spec, p.parameter_count());
  data["policy"] = policy_json(run_->policy);
  data["steps"] = config_.steps;
  data["categories"] = nlohmann::json::array();
  for (Category c : kAllCategories) data["categories"].push_back(category_name(c));
  data["sections"] = nlohmann::json::array();
  for (const Section& s : p.sections())
    data["sections"].push_back({{"name", s.name}, {"begin", s.begin}, {"end", s.end}, {"repeat", s.repeat}});
  nlohmann::json ops = nlohmann::json::array(), live_json = nlohmann::json::array(), op_ms = nlohmann::json::array();
  for (int i = 0; i < n_ops; ++i) {
    const Op& op = p.op(i);
    ops.push_back({op.name, op_kind_name(op.kind), phase_name(op.phase), op.layer});
    live_json.push_back(dev.live_by_category[size_t(i)]);
    op_ms.push_back(op_seconds[size_t(i)] < 0 ? nlohmann::json() : nlohmann::json(op_seconds[size_t(i)] * 1e3));
  }
  data["ops"] = std::move(ops);
  data["op_ms"] = std::move(op_ms);
  nlohmann::json mtop = nlohmann::json::array(), mlive = nlohmann::json::array();
  for (int64_t m : measured_top) mtop.push_back(m < 0 ? nlohmann::json() : nlohmann::json(m));
  for (int64_t m : measured_live) mlive.push_back(m < 0 ? nlohmann::json() : nlohmann::json(m));
  data["device"] = {{"live", std::move(live_json)},
                    {"planned_top", planned_top},
                    {"measured_top", std::move(mtop)},
                    {"measured_live", std::move(mlive)},
                    {"peak_bytes", dev.peak_bytes},
                    {"peak_op", dev.peak_op},
                    {"measured_high_water", measured_peak}};
  data["top_tensors"] = nlohmann::json::array();
  for (size_t i = 0; i < std::min(kTopTensors, live.size()); ++i) {
    const LiveTensor& t = live[i];
    data["top_tensors"].push_back({{"name", p.tensor(t.tensor).name},
                                   {"category", category_name(t.category)},
                                   {"bytes", t.bytes},
                                   {"layer", t.layer},
                                   {"made_by", t.persistent ? "(persistent)" : p.op(t.born).name},
                                   {"last_used_by", t.persistent ? "(persistent)" : p.op(t.dies).name}});
  }
  data["live_at_peak"] = {{"tensors", live.size()}, {"bytes", dev.peak_op >= 0 ? dev.live_bytes[size_t(dev.peak_op)] : 0}};
  data["layers"] = nlohmann::json::array();
  for (const LayerBytes& l : layers)
    data["layers"].push_back({{"layer", l.layer}, {"by_category", l.by_category}, {"total", l.total},
                              {"ms_per_step", layer_seconds[l.layer] * 1e3}});
  const std::string top_words =
      worst_gap == 0 ? fmt::format("equal at all {} ops", ran)
                     : fmt::format("equal at {} of {} ops; largest gap {} at op {} '{}'", equal, ran, format_bytes(worst_gap),
                                   worst_op, p.op(worst_op).name);
  data["plan_vs_measured"] = nlohmann::json::array(
      {{{"what", "device peak (arena high-water)"},
        {"planned", fmt::format("{} ({} bytes)", format_bytes(dev.peak_bytes), dev.peak_bytes)},
        {"measured", fmt::format("{} ({} bytes)", format_bytes(measured_peak), measured_peak)},
        {"agree", measured_peak == dev.peak_bytes}},
       {{"what", "device arena top at each op"},
        {"planned", fmt::format("{} ops", n_ops)},
        {"measured", top_words},
        {"agree", worst_gap == 0}},
       {{"what", "device live bytes per category at each op"},
        {"planned", fmt::format("{} op executions", events.size())},
        {"measured", fmt::format("equal at {} of {}", live_equal, events.size())},
        {"agree", live_equal == events.size()}},
       {{"what", "time per step"},
        {"planned", "(no time model yet)"},
        {"measured", fmt::format("{:.2f} ms (mean over steps after the first)", step_seconds * 1e3)},
        {"agree", nullptr}},
       {{"what", "process memory"},
        {"planned", fmt::format("arenas {}", format_bytes(dev.peak_bytes))},
        {"measured", fmt::format("max RSS {}", format_bytes(max_rss))},
        {"agree", nullptr}}});
  data["phase_ms_per_step"] = nlohmann::json::object();
  for (const auto& [phase, s] : by_phase)
    if (s > 0) data["phase_ms_per_step"][phase] = s * 1e3;

  nlohmann::json other = {{"model", data["model"]}, {"policy", data["policy"]}, {"steps", config_.steps}};
  const nlohmann::json trace = chrome_trace(p, plan, events, true, other);
  write_text(trace_path_, trace.dump() + "\n");
  write_text(html_path_, profile_html(data));

  // The same summary as text.
  log << fmt::format("profile: {} op executions recorded ({} dropped); trace {}; report {}\n", events.size(),
                     recorder_->dropped(), trace_path_, html_path_);
  std::string phases;
  for (const auto& [phase, s] : by_phase)
    if (s > 0) phases += fmt::format(" {} {:.2f} ms,", phase, s * 1e3);
  if (!phases.empty()) phases.pop_back();
  log << fmt::format("  time per step {:.2f} ms:{}\n", step_seconds * 1e3, phases);
  if (dev.peak_op >= 0) {
    const Op& op = p.op(dev.peak_op);
    log << fmt::format("  device peak {} at op {} '{}' ({}, {}); measured high-water {}{}\n", format_bytes(dev.peak_bytes),
                       dev.peak_op, op.name, op_kind_name(op.kind), phase_name(op.phase), format_bytes(measured_peak),
                       measured_peak == dev.peak_bytes ? " (equal)" : " (DIFFERENT)");
  }
  log << fmt::format("  measured arena top vs planned: {}\n", top_words);
  log << fmt::format("  measured live bytes per category vs planned: equal at {} of {} op executions\n", live_equal,
                     events.size());
  log << "  largest tensors live at the peak:\n";
  for (size_t i = 0; i < std::min(kTopTensorsText, live.size()); ++i)
    log << fmt::format("    {:>12}  {}\n", format_bytes(live[i].bytes), describe_live_tensor(p, live[i]));
  log << "  per layer at the peak:\n";
  for (const LayerBytes& l : layers) {
    std::string cats;
    for (Category c : kAllCategories)
      if (l.by_category[size_t(c)] > 0) cats += fmt::format(" {} {},", category_name(c), format_bytes(l.by_category[size_t(c)]));
    if (!cats.empty()) cats.pop_back();
    log << fmt::format("    {:<15} {:>12}  {:7.2f} ms/step |{}\n", layer_name(l.layer), format_bytes(l.total),
                       layer_seconds[l.layer] * 1e3, cats);
  }

  report["profile"] = {{"trace", trace_path_},
                       {"html", html_path_},
                       {"op_executions", events.size()},
                       {"dropped", recorder_->dropped()},
                       {"measured_top_equal_ops", equal},
                       {"measured_top_ops", ran},
                       {"measured_top_largest_gap_bytes", worst_gap},
                       {"measured_live_equal_executions", live_equal}};
}

}  // namespace memfit
