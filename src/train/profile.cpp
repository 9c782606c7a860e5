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

// Times an op runs per optimizer step (Section::runs_per_step).
int runs_per_step(const Program& p, int op) {
  const int s = p.section_of_op(op);
  if (s < 0) return 0;
  return p.sections()[size_t(s)].runs_per_step();
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
    if (s.kind == SectionKind::eval) eval_ops = n;
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

namespace {

// What a profiled run showed, computed once from the plan and the recorder's events; the
// page's data object, the text summary and the report's "profile" entry are views of it.
struct ProfileAnalysis {
  int n_ops = 0;
  size_t executions = 0;
  std::vector<uint64_t> planned_top;
  std::vector<double> op_seconds;  // mean per execution, -1 never ran
  // Per op at its latest execution (steady state), -1 when it never ran.
  std::vector<int64_t> measured_top, measured_live;
  size_t live_equal = 0;  // executions whose live bytes per category equal the plan
  int ran = 0, top_equal = 0, worst_op = -1;
  uint64_t worst_gap = 0, measured_peak = 0, max_rss = 0;
  double step_seconds = 0;
  std::map<std::string, double> phase_seconds;
  std::map<int, double> layer_seconds;
  std::vector<LiveTensor> live;  // at the planned peak, largest first
  std::vector<LayerBytes> layers;
};

ProfileAnalysis analyse_profile(const Program& p, const MemoryPlan& plan, std::span<const TraceEvent> events,
                                uint64_t measured_peak) {
  const TierPlan& dev = plan.tier(Tier::device);
  ProfileAnalysis a;
  a.n_ops = int(p.ops().size());
  a.executions = events.size();
  const std::vector<PlannedBuffer> buffers = planned_buffers(p, plan);
  a.planned_top = planned_arena_top(buffers, Tier::device, a.n_ops);
  a.op_seconds = mean_op_seconds(a.n_ops, events);
  a.measured_top.assign(size_t(a.n_ops), -1);
  a.measured_live.assign(size_t(a.n_ops), -1);
  for (const TraceEvent& e : events) {
    a.measured_top[size_t(e.op)] = int64_t(e.measured_top[size_t(Tier::device)]);
    uint64_t total = 0;
    for (uint64_t b : e.measured_live) total += b;
    a.measured_live[size_t(e.op)] = int64_t(total);
    a.live_equal += e.measured_live == dev.live_by_category[size_t(e.op)];
  }
  for (int i = 0; i < a.n_ops; ++i) {
    if (a.measured_top[size_t(i)] < 0) continue;
    ++a.ran;
    const uint64_t m = uint64_t(a.measured_top[size_t(i)]), pl = a.planned_top[size_t(i)];
    if (m == pl) ++a.top_equal;
    const uint64_t gap = m > pl ? m - pl : pl - m;
    if (gap > a.worst_gap) a.worst_gap = gap, a.worst_op = i;
  }
  a.measured_peak = measured_peak;
  for (int i = 0; i < a.n_ops; ++i) {  // time per step, by phase and by layer
    const double s = std::max(0.0, a.op_seconds[size_t(i)]) * runs_per_step(p, i);
    a.step_seconds += s;
    a.phase_seconds[std::string(phase_name(p.op(i).phase))] += s;
    a.layer_seconds[p.op(i).layer] += s;
  }
  a.live = live_tensors_at(p, plan, buffers, Tier::device, dev.peak_op);
  a.layers = bytes_by_layer(a.live);
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  a.max_rss = uint64_t(u.ru_maxrss) * 1024;
  return a;
}

std::string top_words(const Program& p, const ProfileAnalysis& a) {
  return a.worst_gap == 0 ? fmt::format("equal at all {} ops", a.ran)
                          : fmt::format("equal at {} of {} ops; largest gap {} at op {} '{}'", a.top_equal, a.ran,
                                        format_bytes(a.worst_gap), a.worst_op, p.op(a.worst_op).name);
}

double seconds_of_layer(const ProfileAnalysis& a, int layer) {
  const auto it = a.layer_seconds.find(layer);
  return it == a.layer_seconds.end() ? 0.0 : it->second;
}

nlohmann::json nullable(int64_t v) { return v < 0 ? nlohmann::json() : nlohmann::json(v); }

nlohmann::json plan_vs_measured_json(const Program& p, const TierPlan& dev, const ProfileAnalysis& a) {
  return nlohmann::json::array(
      {{{"what", "device peak (arena high-water)"},
        {"planned", fmt::format("{} ({} bytes)", format_bytes(dev.peak_bytes), dev.peak_bytes)},
        {"measured", fmt::format("{} ({} bytes)", format_bytes(a.measured_peak), a.measured_peak)},
        {"agree", a.measured_peak == dev.peak_bytes}},
       {{"what", "device arena top at each op"},
        {"planned", fmt::format("{} ops", a.n_ops)},
        {"measured", top_words(p, a)},
        {"agree", a.worst_gap == 0}},
       {{"what", "device live bytes per category at each op"},
        {"planned", fmt::format("{} op executions", a.executions)},
        {"measured", fmt::format("equal at {} of {}", a.live_equal, a.executions)},
        {"agree", a.live_equal == a.executions}},
       {{"what", "time per step"},
        {"planned", "(no time model yet)"},
        {"measured", fmt::format("{:.2f} ms (mean over steps after the first)", a.step_seconds * 1e3)},
        {"agree", nullptr}},
       {{"what", "process memory"},
        {"planned", fmt::format("arenas {}", format_bytes(dev.peak_bytes))},
        {"measured", fmt::format("max RSS {}", format_bytes(a.max_rss))},
        {"agree", nullptr}}});
}

// The data object of report.html (profile_html draws it).
nlohmann::json profile_page_data(const PreparedRun& run, int64_t steps, const ProfileAnalysis& a) {
  const Program& p = run.compiled.program;
  const TierPlan& dev = run.compiled.plan.tier(Tier::device);
  nlohmann::json data;
  data["title"] = fmt::format("{}, batch {} x {}, accumulation {}, {}", run.spec.name, run.policy.batch,
                              run.policy.seq, run.policy.grad_accum, precision_name(run.policy.precision));
  data["model"] = model_json(run.spec, p.parameter_count());
  data["policy"] = policy_json(run.policy);
  data["steps"] = steps;
  data["categories"] = nlohmann::json::array();
  for (Category c : kAllCategories) data["categories"].push_back(category_name(c));
  data["sections"] = nlohmann::json::array();
  for (const Section& s : p.sections())
    data["sections"].push_back({{"name", section_name(s.kind)}, {"begin", s.begin}, {"end", s.end}, {"repeat", s.repeat}});
  nlohmann::json ops = nlohmann::json::array(), live = nlohmann::json::array(), op_ms = nlohmann::json::array();
  for (int i = 0; i < a.n_ops; ++i) {
    const Op& op = p.op(i);
    ops.push_back({op.name, op_kind_name(op.kind), phase_name(op.phase), op.layer});
    live.push_back(dev.live_by_category[size_t(i)]);
    op_ms.push_back(a.op_seconds[size_t(i)] < 0 ? nlohmann::json() : nlohmann::json(a.op_seconds[size_t(i)] * 1e3));
  }
  data["ops"] = std::move(ops);
  data["op_ms"] = std::move(op_ms);
  nlohmann::json mtop = nlohmann::json::array(), mlive = nlohmann::json::array();
  for (int64_t m : a.measured_top) mtop.push_back(nullable(m));
  for (int64_t m : a.measured_live) mlive.push_back(nullable(m));
  data["device"] = {{"live", std::move(live)},          {"planned_top", a.planned_top},
                    {"measured_top", std::move(mtop)},  {"measured_live", std::move(mlive)},
                    {"peak_bytes", dev.peak_bytes},     {"peak_op", dev.peak_op},
                    {"measured_high_water", a.measured_peak}};
  data["top_tensors"] = nlohmann::json::array();
  for (size_t i = 0; i < std::min(kTopTensors, a.live.size()); ++i) {
    const LiveTensor& t = a.live[i];
    data["top_tensors"].push_back({{"name", p.tensor(t.tensor).name},
                                   {"category", category_name(t.category)},
                                   {"bytes", t.bytes},
                                   {"layer", t.layer},
                                   {"made_by", t.persistent ? "(persistent)" : p.op(t.born).name},
                                   {"last_used_by", t.persistent ? "(persistent)" : p.op(t.dies).name}});
  }
  data["live_at_peak"] = {{"tensors", a.live.size()},
                          {"bytes", dev.peak_op >= 0 ? dev.live_bytes[size_t(dev.peak_op)] : 0}};
  data["layers"] = nlohmann::json::array();
  for (const LayerBytes& l : a.layers)
    data["layers"].push_back({{"layer", l.layer}, {"by_category", l.by_category}, {"total", l.total},
                              {"ms_per_step", seconds_of_layer(a, l.layer) * 1e3}});
  data["plan_vs_measured"] = plan_vs_measured_json(p, dev, a);
  data["phase_ms_per_step"] = nlohmann::json::object();
  for (const auto& [phase, s] : a.phase_seconds)
    if (s > 0) data["phase_ms_per_step"][phase] = s * 1e3;
  return data;
}

void print_profile_summary(const Program& p, const TierPlan& dev, const ProfileAnalysis& a, std::ostream& log) {
  std::string phases;
  for (const auto& [phase, s] : a.phase_seconds)
    if (s > 0) phases += fmt::format(" {} {:.2f} ms,", phase, s * 1e3);
  if (!phases.empty()) phases.pop_back();
  log << fmt::format("  time per step {:.2f} ms:{}\n", a.step_seconds * 1e3, phases);
  if (dev.peak_op >= 0) {
    const Op& op = p.op(dev.peak_op);
    log << fmt::format("  device peak {} at op {} '{}' ({}, {}); measured high-water {}{}\n", format_bytes(dev.peak_bytes),
                       dev.peak_op, op.name, op_kind_name(op.kind), phase_name(op.phase), format_bytes(a.measured_peak),
                       a.measured_peak == dev.peak_bytes ? " (equal)" : " (DIFFERENT)");
  }
  log << fmt::format("  measured arena top vs planned: {}\n", top_words(p, a));
  log << fmt::format("  measured live bytes per category vs planned: equal at {} of {} op executions\n", a.live_equal,
                     a.executions);
  log << "  largest tensors live at the peak:\n";
  for (size_t i = 0; i < std::min(kTopTensorsText, a.live.size()); ++i)
    log << fmt::format("    {:>12}  {}\n", format_bytes(a.live[i].bytes), describe_live_tensor(p, a.live[i]));
  log << "  per layer at the peak:\n";
  for (const LayerBytes& l : a.layers) {
    std::string cats;
    for (Category c : kAllCategories)
      if (l.by_category[size_t(c)] > 0) cats += fmt::format(" {} {},", category_name(c), format_bytes(l.by_category[size_t(c)]));
    if (!cats.empty()) cats.pop_back();
    log << fmt::format("    {:<15} {:>12}  {:7.2f} ms/step |{}\n", layer_name(l.layer), format_bytes(l.total),
                       seconds_of_layer(a, l.layer) * 1e3, cats);
  }
}

}  // namespace

void ProfileHooks::after_run(Executor& ex, nlohmann::json& report, std::ostream& log) {
  MEMFIT_ASSERT(run_ && recorder_, "profile hooks used before the steps");
  const Program& p = run_->compiled.program;
  const MemoryPlan& plan = run_->compiled.plan;
  const std::span<const TraceEvent> events = recorder_->events();
  const ProfileAnalysis a = analyse_profile(p, plan, events, ex.buffer(Tier::device).measured_high_water());

  const nlohmann::json data = profile_page_data(*run_, config_.steps, a);
  const nlohmann::json other = {{"model", data["model"]}, {"policy", data["policy"]}, {"steps", config_.steps}};
  write_text(trace_path_, chrome_trace(p, plan, events, true, other).dump() + "\n");
  write_text(html_path_, profile_html(data));

  log << fmt::format("profile: {} op executions recorded ({} dropped); trace {}; report {}\n", a.executions,
                     recorder_->dropped(), trace_path_, html_path_);
  print_profile_summary(p, plan.tier(Tier::device), a, log);
  report["profile"] = {{"trace", trace_path_},
                       {"html", html_path_},
                       {"op_executions", a.executions},
                       {"dropped", recorder_->dropped()},
                       {"measured_top_equal_ops", a.top_equal},
                       {"measured_top_ops", a.ran},
                       {"measured_top_largest_gap_bytes", a.worst_gap},
                       {"measured_live_equal_executions", a.live_equal}};
}

}  // namespace memfit
