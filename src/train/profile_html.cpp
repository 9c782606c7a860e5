// The profile report page: one self-contained HTML file. The data object is embedded as JSON
// in a <script type="application/json"> element; the inline script draws the memory timeline
// as an SVG stacked area (one <path class="cat-area"> per category that holds bytes, the
// planned and measured arena tops as lines, a <g id="peak-marker"> at the peak) and fills the
// tables. Nothing is loaded from the network.
// Subtle point: every '<' in the JSON is written as \u003c, so no string in the data (a tensor
// name, a path) can close the script element.
#include <string>

#include "train/profile.hpp"

namespace memfit {

namespace {

constexpr const char* kHead = R"HTML(<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>memfit profile</title>
<style>
  body { font: 14px/1.4 system-ui, -apple-system, "DejaVu Sans", sans-serif; margin: 24px; color: #1d2330; background: #fff; }
  h1 { font-size: 22px; margin: 0 0 4px; }
  h2 { font-size: 16px; margin: 28px 0 8px; }
  .sub { color: #555; margin: 0 0 12px; }
  table { border-collapse: collapse; font-size: 13px; }
  th, td { padding: 3px 10px; border-bottom: 1px solid #e3e6ec; text-align: left; white-space: nowrap; }
  td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; }
  tr.ok td.verdict { color: #17803d; } tr.bad td.verdict { color: #b3261e; font-weight: 600; }
  #legend span { display: inline-block; margin: 0 14px 4px 0; }
  #legend i { display: inline-block; width: 11px; height: 11px; margin-right: 5px; vertical-align: -1px; }
  #hover { min-height: 20px; color: #333; font-family: monospace; font-size: 12px; }
  svg text { font-size: 11px; fill: #444; }
  .axis line, .axis path { stroke: #999; }
</style>
</head>
<body>
<h1>memfit profile</h1>
<p class="sub" id="subtitle"></p>
<h2>Memory timeline: device tier, planned live bytes by category, one step of ops</h2>
<svg id="timeline" width="1100" height="440" viewBox="0 0 1100 440" role="img" aria-label="memory timeline"></svg>
<div id="legend"></div>
<div id="hover"></div>
<h2>Largest tensors live at the peak</h2>
<table id="top-tensors"></table>
<h2>Per-layer breakdown at the peak</h2>
<table id="layers"></table>
<h2>Plan vs measurement</h2>
<table id="plan-vs-measured"></table>
<p class="sub">Measured, after each op: the arena is scanned for its highest byte that differs from the start-up
sentinel (measured arena top), and the buffers the plan says are live are checked for anything but the sentinel
(measured live bytes, a buffer counting whole); buffers whose planned interval ended at that op are then returned to
the sentinel, so the scans see live data only.</p>
<script type="application/json" id="memfit-data">)HTML";

constexpr const char* kTail = R"HTML(</script>
<script>
(function () {
  "use strict";
  const data = JSON.parse(document.getElementById("memfit-data").textContent);
  const NS = "http://www.w3.org/2000/svg";
  const colors = ["#4e79a7", "#9c755f", "#f28e2b", "#e15759", "#59a14f", "#edc948", "#b07aa1", "#76b7b2"];
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  function bytes(v) {
    if (v === null || v === undefined) return "-";
    let u = 0;
    while (Math.abs(v) >= 1024 && u < units.length - 1) { v /= 1024; ++u; }
    return (u === 0 ? v.toFixed(0) : String(parseFloat(v.toPrecision(4)))) + " " + units[u];
  }
  function el(name, attrs, parent) {
    const e = document.createElementNS(NS, name);
    for (const k in attrs) e.setAttribute(k, attrs[k]);
    if (parent) parent.appendChild(e);
    return e;
  }
  function row(table, cells, header, cls) {
    const tr = document.createElement("tr");
    if (cls) tr.className = cls;
    cells.forEach(function (c) {
      const td = document.createElement(header ? "th" : "td");
      if (typeof c === "object" && c !== null) { td.textContent = c.text; if (c.cls) td.className = c.cls; }
      else td.textContent = c;
      tr.appendChild(td);
    });
    table.appendChild(tr);
  }

  const ops = data.ops, dev = data.device, n = ops.length, cats = data.categories;
  document.getElementById("subtitle").textContent = data.title + " \u00b7 " + n + " ops per step \u00b7 " +
      data.steps + " steps profiled \u00b7 planned peak " + bytes(dev.peak_bytes);

  // ---- timeline ----
  const svg = document.getElementById("timeline");
  const W = 1100, H = 440, L = 78, R = 16, T = 26, B = 48;
  let ymax = dev.peak_bytes;
  dev.planned_top.forEach(function (v) { ymax = Math.max(ymax, v); });
  dev.measured_top.forEach(function (v) { if (v !== null) ymax = Math.max(ymax, v); });
  ymax = Math.max(1, ymax * 1.08);
  // Y axis: round steps (1, 2, 2.5 or 5 times a power of ten) of the largest binary unit
  // below the top, which is rounded up to a whole step.
  let unit = 1;
  while (unit * 1024 <= ymax) unit *= 1024;
  const raw = ymax / unit / 5, mag = Math.pow(10, Math.floor(Math.log10(raw)));
  const step = unit * mag * [1, 2, 2.5, 5, 10].find(function (m) { return m * mag >= raw; });
  ymax = Math.ceil(ymax / step - 1e-9) * step;
  const x = function (i) { return L + (W - L - R) * i / n; };
  const y = function (v) { return T + (H - T - B) * (1 - v / ymax); };

  // Sections as shaded bands, labelled where there is room.
  data.sections.forEach(function (s, k) {
    const w = Math.max(0, x(s.end) - x(s.begin));
    el("rect", { x: x(s.begin), y: T, width: w, height: H - T - B, fill: k % 2 ? "#eef1f7" : "#fafbfd",
                 class: "section" }, svg);
    if (w < 60) return;
    const label = el("text", { x: x(s.begin) + 4, y: T - 8 }, svg);
    label.textContent = s.name + (s.repeat > 1 ? " \u00d7" + s.repeat : "");
  });
  const axis = el("g", { class: "axis" }, svg);
  for (let k = 0; k * step <= ymax * (1 + 1e-9); ++k) {
    const v = k * step;
    el("line", { x1: L, x2: W - R, y1: y(v), y2: y(v), stroke: "#e3e6ec" }, axis);
    const t = el("text", { x: L - 6, y: y(v) + 4, "text-anchor": "end" }, axis);
    t.textContent = bytes(v);
  }
  for (let k = 0; k <= 10; ++k) {
    const i = Math.round(n * k / 10);
    const t = el("text", { x: x(i), y: H - B + 16, "text-anchor": "middle" }, axis);
    t.textContent = i;
  }
  const xl = el("text", { x: (L + W - R) / 2, y: H - 10, "text-anchor": "middle" }, axis);
  xl.textContent = "op (program order)";

  // Stacked areas, one path per category that ever holds bytes; step-shaped (an op is a step).
  const lower = new Array(n).fill(0);
  const shown = [];
  cats.forEach(function (name, c) {
    let any = false;
    for (let i = 0; i < n; ++i) if (dev.live[i][c] > 0) { any = true; break; }
    if (!any) return;
    const upper = lower.map(function (v, i) { return v + dev.live[i][c]; });
    let d = "M" + x(0) + "," + y(upper[0]);
    for (let i = 0; i < n; ++i) d += "H" + x(i + 1) + (i + 1 < n ? "V" + y(upper[i + 1]) : "");
    d += "V" + y(lower[n - 1]);
    for (let i = n - 1; i >= 0; --i) d += "H" + x(i) + (i > 0 ? "V" + y(lower[i - 1]) : "");
    d += "Z";
    el("path", { d: d, fill: colors[c], "fill-opacity": 0.85, stroke: "none", class: "cat-area",
                 "data-category": name }, svg);
    for (let i = 0; i < n; ++i) lower[i] = upper[i];
    shown.push(c);
  });
  function stepLine(values, attrs) {
    let d = "", pen = false;
    for (let i = 0; i < n; ++i) {
      const v = values[i];
      if (v === null) { pen = false; continue; }
      d += (pen ? "V" : "M" + x(i) + ",") + y(v) + "H" + x(i + 1);
      pen = true;
    }
    attrs.d = d;
    attrs.fill = "none";
    return el("path", attrs, svg);
  }
  // Planned top wide and pale under the measured one, so both show where they coincide.
  stepLine(dev.planned_top, { stroke: "#1d2330", "stroke-width": 4, "stroke-opacity": 0.3, class: "top-planned" });
  stepLine(dev.measured_top, { stroke: "#d62728", "stroke-width": 1.2, class: "top-measured" });
  stepLine(dev.measured_live, { stroke: "#111", "stroke-width": 1, "stroke-dasharray": "2,2", class: "live-measured" });

  // Peak marker.
  if (dev.peak_op >= 0) {
    const g = el("g", { id: "peak-marker" }, svg);
    const px = (x(dev.peak_op) + x(dev.peak_op + 1)) / 2;
    el("line", { x1: px, x2: px, y1: y(0), y2: y(dev.peak_bytes), stroke: "#b3261e", "stroke-width": 1.5 }, g);
    el("circle", { cx: px, cy: y(dev.peak_bytes), r: 5, fill: "#b3261e" }, g);
    const right = px < (L + W) / 2;
    const t = el("text", { x: px + (right ? 9 : -9), y: y(dev.peak_bytes) - 8, "text-anchor": right ? "start" : "end",
                           style: "font-weight:600;fill:#b3261e" }, g);
    t.textContent = "peak " + bytes(dev.peak_bytes) + " at op " + dev.peak_op + " " + ops[dev.peak_op][0];
  }

  // Legend.
  const legend = document.getElementById("legend");
  shown.forEach(function (c) {
    const s = document.createElement("span");
    s.innerHTML = '<i style="background:' + colors[c] + '"></i>';
    s.appendChild(document.createTextNode(cats[c] + " " + bytes(dev.peak_op >= 0 ? dev.live[dev.peak_op][c] : 0)));
    legend.appendChild(s);
  });
  [["planned arena top", "rgba(29,35,48,0.3)", 4], ["measured arena top", "#d62728", 2],
   ["measured live bytes", "#111", 1]].forEach(function (p) {
    const s = document.createElement("span");
    s.innerHTML = '<i style="background:' + p[1] + ';height:' + p[2] + 'px;vertical-align:3px"></i>';
    s.appendChild(document.createTextNode(p[0]));
    legend.appendChild(s);
  });

  // Hover: the op under the pointer.
  const hover = document.getElementById("hover");
  svg.addEventListener("mousemove", function (ev) {
    const r = svg.getBoundingClientRect();
    const i = Math.floor((ev.clientX - r.left - L) / (W - L - R) * n);
    if (i < 0 || i >= n) { hover.textContent = ""; return; }
    const live = dev.live[i].reduce(function (a, b) { return a + b; }, 0);
    const ms = data.op_ms[i];
    hover.textContent = "op " + i + " " + ops[i][0] + " (" + ops[i][1] + ", " + ops[i][2] +
        (ops[i][3] >= 0 ? ", layer " + ops[i][3] : "") + "): live " + bytes(live) + ", planned top " +
        bytes(dev.planned_top[i]) + ", measured top " + bytes(dev.measured_top[i]) + ", measured live " +
        bytes(dev.measured_live[i]) +
        (ms !== null ? ", " + ms.toFixed(3) + " ms" : "");
  });

  // ---- tables ----
  const tt = document.getElementById("top-tensors");
  row(tt, ["bytes", "tensor", "category", "layer", "made by", "last used by"], true);
  data.top_tensors.forEach(function (t) {
    row(tt, [{ text: bytes(t.bytes), cls: "num" }, t.name, t.category, t.layer >= 0 ? t.layer : "-", t.made_by,
             t.last_used_by]);
  });
  row(tt, [{ text: bytes(data.live_at_peak.bytes), cls: "num" },
           "all " + data.live_at_peak.tensors + " live buffers", "", "", "", ""]);

  const lt = document.getElementById("layers");
  const used = shown.slice();
  row(lt, ["layer"].concat(used.map(function (c) { return cats[c]; })).concat(["total", "ms per step"]), true);
  data.layers.forEach(function (l) {
    row(lt, [l.layer >= 0 ? "layer " + l.layer : "outside blocks"]
        .concat(used.map(function (c) { return { text: l.by_category[c] ? bytes(l.by_category[c]) : "", cls: "num" }; }))
        .concat([{ text: bytes(l.total), cls: "num" }, { text: l.ms_per_step.toFixed(2), cls: "num" }]));
  });

  const pv = document.getElementById("plan-vs-measured");
  row(pv, ["", "planned", "measured", ""], true);
  data.plan_vs_measured.forEach(function (r) {
    const verdict = r.agree === true ? "agree" : r.agree === false ? "differ" : "";
    row(pv, [r.what, r.planned, r.measured, { text: verdict, cls: "verdict" }], false,
        r.agree === true ? "ok" : r.agree === false ? "bad" : "");
  });
  document.body.setAttribute("data-rendered", "yes");
})();
</script>
</body>
</html>
)HTML";

}  // namespace

std::string profile_html(const nlohmann::json& data) {
  const std::string json = data.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  std::string escaped;
  escaped.reserve(json.size());
  for (char ch : json) {
    if (ch == '<') escaped += "\\u003c";
    else escaped += ch;
  }
  return std::string(kHead) + escaped + kTail;
}

}  // namespace memfit
