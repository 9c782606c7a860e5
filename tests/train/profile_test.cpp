// `memfit profile` end to end on gpt2-tiny (2 steps, then validation):
//   * trace.json is valid trace-event JSON (strict parser; the fields Perfetto and
//     chrome://tracing need on every event), holds one slice per executed op, and its counters
//     equal the plan at every op: live bytes per category and per tier, the arena top; the
//     measured live bytes per category equal the planned ones; the measured top never exceeds
//     the planned one and reaches the planned peak;
//   * report.html is self-contained (no network references) and renders in headless Chromium:
//     the SVG gets one area per category that holds bytes and a peak marker, and the tables
//     are filled. The test is skipped only when Chromium is missing or cannot start here.
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>

#include <nlohmann/json.hpp>

#include "plan/buffers.hpp"
#include "runtime/trace.hpp"
#include "support/run_cli.hpp"
#include "train/trainer.hpp"

namespace memfit {
namespace {

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

class Profile : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = test::temp_dir() + "/profile";
    result_ = test::run_memfit("profile --batch 2 --seq 32 --steps 2 --out " + dir_);
  }
  static RunConfig config() {
    RunConfig c;
    c.policy.batch = 2;
    c.policy.seq = 32;
    return c;
  }
  static inline std::string dir_;
  static inline test::CliResult result_;
};

// One test for what needs no browser (each test of the suite runs in its own process under
// ctest, and each process profiles once).
TEST_F(Profile, SummaryTraceAndSelfContainedReport) {
  ASSERT_EQ(result_.status, 0) << result_.out << result_.err;
  for (const char* needle : {"profile: ", "largest tensors live at the peak", "per layer at the peak", "measured high-water",
                             "measured arena top vs planned: equal at all"})
    EXPECT_NE(result_.out.find(needle), std::string::npos) << needle << " missing from\n" << result_.out;

  const std::string html = slurp(dir_ + "/report.html");
  std::string rest = html;
  const std::string svg_ns = "http://www.w3.org/2000/svg";  // a namespace name, never fetched
  for (size_t at; (at = rest.find(svg_ns)) != std::string::npos;) rest.erase(at, svg_ns.size());
  for (const char* bad : {"http://", "https://", "<link", "src=", "@import", "url("})
    EXPECT_EQ(rest.find(bad), std::string::npos) << bad;

  const nlohmann::json trace = nlohmann::json::parse(slurp(dir_ + "/trace.json"));  // throws on invalid JSON
  ASSERT_TRUE(trace.is_object());
  ASSERT_TRUE(trace["traceEvents"].is_array());
  EXPECT_EQ(trace["displayTimeUnit"], "ms");

  auto backend = make_cpu_backend();
  const PreparedRun run = prepare_run(config(), *backend);
  const Program& p = run.compiled.program;
  const MemoryPlan& plan = run.compiled.plan;
  const TierPlan& dev = plan.tier(Tier::device);
  const std::vector<uint64_t> top = planned_arena_top(planned_buffers(p, plan), Tier::device, int(p.ops().size()));

  std::map<std::pair<std::string, double>, nlohmann::json> counters;  // (name, ts) -> args
  std::vector<nlohmann::json> slices;
  for (const auto& e : trace["traceEvents"]) {
    ASSERT_TRUE(e.is_object());
    ASSERT_TRUE(e["ph"].is_string()) << e;
    ASSERT_TRUE(e["name"].is_string()) << e;
    ASSERT_TRUE(e["pid"].is_number_integer()) << e;
    const std::string ph = e["ph"];
    if (ph == "M") {
      EXPECT_TRUE(e["args"]["name"].is_string()) << e;
    } else if (ph == "X") {
      ASSERT_TRUE(e["ts"].is_number() && e["dur"].is_number() && e["tid"].is_number_integer()) << e;
      EXPECT_GE(e["ts"].get<double>(), 0);
      EXPECT_GE(e["dur"].get<double>(), 0);
      if (e["tid"] == 1) slices.push_back(e);
    } else if (ph == "C") {
      ASSERT_TRUE(e["ts"].is_number() && e["args"].is_object()) << e;
      for (const auto& [k, v] : e["args"].items()) ASSERT_TRUE(v.is_number()) << e;
      counters[{e["name"], e["ts"].get<double>()}] = e["args"];
    } else {
      FAIL() << "unexpected event phase " << ph;
    }
  }
  // One slice per op execution: 2 steps of the micro and optimizer sections, 4 validation batches.
  size_t expected = 0;
  for (const Section& s : p.sections()) expected += size_t(s.end - s.begin) * (s.kind == SectionKind::eval ? 4 : 2 * s.repeat);
  ASSERT_EQ(slices.size(), expected);

  uint64_t measured_max = 0;
  double last_ts = -1;
  for (const auto& s : slices) {
    const int op = s["args"]["op"];
    const double ts = s["ts"];
    EXPECT_GE(ts, last_ts);
    last_ts = ts;
    EXPECT_EQ(s["name"], p.op(op).name);
    EXPECT_EQ(s["cat"], std::string(phase_name(p.op(op).phase)));
    EXPECT_EQ(s["args"]["layer"], p.op(op).layer);
    const auto& live = counters.at({std::string(kTraceLiveCounter) + " (device)", ts});
    for (Category c : kAllCategories) {
      const uint64_t planned = dev.live_by_category[size_t(op)][size_t(c)];
      const std::string name(category_name(c));
      if (live.contains(name)) EXPECT_EQ(live[name].get<uint64_t>(), planned) << name << " at op " << op;
      else EXPECT_EQ(planned, 0u) << name << " missing at op " << op;
    }
    EXPECT_EQ(counters.at({kTraceTierCounter, ts})["device"].get<uint64_t>(), dev.live_bytes[size_t(op)]);
    EXPECT_EQ(counters.at({kTracePlannedTop, ts})["device"].get<uint64_t>(), top[size_t(op)]);
    const auto& measured_live = counters.at({kTraceMeasuredLive, ts});
    for (const auto& [name, bytes] : measured_live.items()) EXPECT_EQ(bytes, live[name]) << name << " at op " << op;
    const uint64_t measured = counters.at({kTraceMeasuredTop, ts})["device"];
    EXPECT_LE(measured, top[size_t(op)]) << "op " << op;
    measured_max = std::max(measured_max, measured);
  }
  EXPECT_EQ(measured_max, dev.peak_bytes);
}

std::string find_chromium() {
  for (const char* name : {"chromium", "chromium-browser", "google-chrome"}) {
    const std::string cmd = std::string("command -v ") + name + " >/dev/null 2>&1";
    if (std::system(cmd.c_str()) == 0) return name;
  }
  return "";
}

// Runs headless Chromium on a page and returns the DOM after its scripts ran; empty on failure.
std::string dump_dom(const std::string& chromium, const std::string& url, const std::string& extra = "") {
  const std::string base = test::temp_dir() + "/chromium";
  const std::string cmd = "timeout 120 " + chromium + " --headless --no-sandbox --disable-gpu --no-first-run " +
                          "--user-data-dir=" + base + "-profile " + extra + " --dump-dom '" + url + "' >" + base +
                          ".out 2>" + base + ".err";
  const int status = std::system(cmd.c_str());
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) return "";
  return slurp(base + ".out");
}

TEST_F(Profile, HtmlRendersInHeadlessChromium) {
  ASSERT_EQ(result_.status, 0) << result_.err;
  const std::string chromium = find_chromium();
  if (chromium.empty()) GTEST_SKIP() << "chromium is not installed (scripts/setup installs it)";
  if (dump_dom(chromium, "data:text/html,<p id=probe>ok</p>").find("probe") == std::string::npos)
    GTEST_SKIP() << "chromium is installed but cannot start here: " << slurp(test::temp_dir() + "/chromium.err");

  const std::string dom = dump_dom(chromium, "file://" + std::filesystem::absolute(dir_ + "/report.html").string());
  ASSERT_FALSE(dom.empty()) << slurp(test::temp_dir() + "/chromium.err");
  EXPECT_NE(dom.find("data-rendered=\"yes\""), std::string::npos) << "the page's script did not finish";

  auto backend = make_cpu_backend();
  const PreparedRun run = prepare_run(config(), *backend);
  const TierPlan& dev = run.compiled.plan.tier(Tier::device);
  int categories = 0;
  for (Category c : kAllCategories) {
    bool any = false;
    for (const CategoryBytes& b : dev.live_by_category) any = any || b[size_t(c)] > 0;
    categories += any;
    const std::string area = "data-category=\"" + std::string(category_name(c)) + "\"";
    EXPECT_EQ(dom.find(area) != std::string::npos, any) << category_name(c);
  }
  const std::regex area_re("<path[^>]*class=\"cat-area\"");
  EXPECT_EQ(std::distance(std::sregex_iterator(dom.begin(), dom.end(), area_re), std::sregex_iterator()), categories);
  EXPECT_NE(dom.find("id=\"peak-marker\""), std::string::npos);
  const std::string peak_label = "at op " + std::to_string(dev.peak_op) + " " + run.compiled.program.op(dev.peak_op).name;
  EXPECT_NE(dom.find(peak_label), std::string::npos) << peak_label;
  // Tables: 20 largest tensors (+ header + total), a row per layer and one outside the blocks.
  const std::regex rows_re("<tr");
  EXPECT_GE(std::distance(std::sregex_iterator(dom.begin(), dom.end(), rows_re), std::sregex_iterator()), 22 + 6 + 5);

  // A screenshot, for people (the repository's docs/profile_report.png is made the same way).
  const std::string png = test::temp_dir() + "/report.png";
  dump_dom(chromium, "file://" + std::filesystem::absolute(dir_ + "/report.html").string(),
           "--window-size=1200,1500 --screenshot=" + png);
  std::printf("screenshot: %s (%ld bytes)\n", png.c_str(),
              long(std::filesystem::exists(png) ? std::filesystem::file_size(png) : 0));
}

}  // namespace
}  // namespace memfit
