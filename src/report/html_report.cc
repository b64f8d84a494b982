#include "report/html_report.h"

#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>

#include "analysis/exit_summary.h"
#include "analysis/histogram.h"
#include "report/format.h"
#include "report/html_assets.h"

namespace exitscope::report {
namespace {

using analysis::ExitRow;
using analysis::ExitTable;
using analysis::LatencyHistogram;
using analysis::LatencyStats;
using nlohmann::json;

// ---- text -----------------------------------------------------------------------------

std::string Esc(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

// JSON fit to sit inside <script type="application/json">: no '<' at all (only strings can
// hold one, and \u003c is the same string), invalid UTF-8 from the inputs replaced.
std::string ScriptJson(const json& j) {
  const std::string s = j.dump(-1, ' ', false, json::error_handler_t::replace);
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    if (c == '<')
      out += "\\u003c";
    else
      out += c;
  }
  return out;
}

// Script text fit to sit inside <script>: "</script" would end the element early.
std::string ScriptText(std::string_view js) {
  std::string out(js);
  for (size_t p = 0; (p = out.find("</script", p)) != std::string::npos; p += 2)
    out.replace(p, 2, "<\\/");
  return out;
}

double Round(double v, double unit) {
  return std::round(v / unit) * unit;
}

// ---- histograms: the rows' own buckets, merged into 4 bins per octave ------------------

// Bin of value v: octave n = floor(log2 v), quarter q of it; bin n*4 + q (v = 0 is bin 0,
// with 1). LatencyHistogram's buckets above 127 split each octave into 64 linear buckets, so
// each of them lies inside one quarter: the merge is exact.
size_t QuarterBin(uint64_t v) {
  if (v == 0) return 0;
  const int n = 63 - std::countl_zero(v);
  const uint64_t base = uint64_t{1} << n;
  const uint64_t q = n >= 2 ? ((v - base) >> (n - 2)) : ((v - base) * 4) >> n;
  return static_cast<size_t>(n) * 4 + static_cast<size_t>(q);
}

uint64_t QuarterLow(size_t bin) {
  const size_t n = bin / 4, q = bin % 4;
  return ((uint64_t{1} << n) * (4 + q)) / 4;
}

std::map<size_t, uint64_t> QuarterCounts(const LatencyHistogram& h) {
  std::map<size_t, uint64_t> m;
  if (h.count() == 0) return m;
  const size_t lo = LatencyHistogram::BucketOf(h.min()), hi = LatencyHistogram::BucketOf(h.max());
  for (size_t b = lo; b <= hi; ++b) {
    if (const uint64_t c = h.bucket_count(b)) m[QuarterBin(LatencyHistogram::BucketLow(b))] += c;
  }
  return m;
}

// One histogram plot over the first `series` rows (most samples first) of `rows`.
json HistogramChart(std::string id, std::string title, std::vector<const ExitRow*> rows,
                    size_t series) {
  std::stable_sort(rows.begin(), rows.end(), [](const ExitRow* a, const ExitRow* b) {
    return a->stats.count() > b->stats.count();
  });
  size_t left_out = 0;
  std::vector<std::pair<std::string, std::map<size_t, uint64_t>>> s;
  for (const ExitRow* r : rows) {
    if (r->stats.count() == 0) continue;
    if (s.size() == series) {
      ++left_out;
      continue;
    }
    std::string name = r->key;
    if (!r->name.empty() && r->name != r->key) name += " (" + r->name + ")";
    s.emplace_back(std::move(name), QuarterCounts(r->stats.histogram()));
  }
  size_t lo = SIZE_MAX, hi = 0;
  for (const auto& [name, m] : s) {
    lo = std::min(lo, m.begin()->first);
    hi = std::max(hi, m.rbegin()->first);
  }
  json cats = json::array(), out_series = json::array(), octave = json::array();
  if (!s.empty()) {
    for (size_t b = lo; b <= hi; ++b) {
      cats.push_back(FormatDurationNs(QuarterLow(b)));
      octave.push_back(b % 4 == 0);  // the bin starts a power of two
    }
    for (const auto& [name, m] : s) {
      json data = json::array();
      for (size_t b = lo; b <= hi; ++b) {
        auto it = m.find(b);
        data.push_back(it == m.end() ? json(nullptr) : json(it->second));
      }
      out_series.push_back({{"name", name}, {"data", std::move(data)}});
    }
  }
  return {{"id", std::move(id)},           {"kind", "hist"},       {"title", std::move(title)},
          {"categories", std::move(cats)}, {"series", out_series}, {"octave", std::move(octave)},
          {"left_out", left_out}};
}

std::vector<const ExitRow*> RowsOf(const ExitTable& t) {
  std::vector<const ExitRow*> v;
  for (const auto& r : t.rows) v.push_back(r.get());
  return v;
}

// ---- timeline and rate -----------------------------------------------------------------

struct Timeline {
  json chart;        // the scatter
  json rate;         // the rate plot
  std::string note;  // "drawn N of M exits ..."
};

// The scatter of `c`'s exits (every slow one up to max_slow_points, plus the longest and the
// shortest of each time bin of each track) and the rate per track. `slow_ns` > 0 marks exits
// at least that long slow too.
Timeline BuildTimeline(const HtmlExitCollector& c, uint64_t slow_ns, const HtmlPlotOptions& o,
                       const std::string& slow_rule) {
  using Point = HtmlExitCollector::Point;
  const auto& pts = c.points();
  const size_t tracks = std::max<size_t>(c.tracks(), 1);
  uint64_t t0 = UINT64_MAX, t1 = 0;
  for (const Point& p : pts) {
    t0 = std::min(t0, p.start_ns);
    t1 = std::max(t1, p.start_ns);
  }
  if (pts.empty()) t0 = t1 = 0;
  const uint64_t span = t1 - t0 + 1;
  const auto is_slow = [&](const Point& p) {
    return p.slow || (slow_ns != 0 && p.duration_ns >= slow_ns);
  };

  // Slow exits: all of them, or the longest max_slow_points.
  std::vector<uint32_t> slow;
  for (uint32_t i = 0; i < pts.size(); ++i)
    if (is_slow(pts[i])) slow.push_back(i);
  const size_t slow_total = slow.size();
  if (slow.size() > o.max_slow_points) {
    std::nth_element(
        slow.begin(), slow.begin() + static_cast<ptrdiff_t>(o.max_slow_points), slow.end(),
        [&](uint32_t a, uint32_t b) { return pts[a].duration_ns > pts[b].duration_ns; });
    slow.resize(o.max_slow_points);
  }
  // The others: per track and time bin, the longest and the shortest.
  const size_t bins = std::max<size_t>(1, o.max_points / (2 * tracks));
  constexpr uint32_t kNone = UINT32_MAX;
  std::vector<std::pair<uint32_t, uint32_t>> pick(tracks * bins, {kNone, kNone});
  const auto bin_of = [&](uint64_t t) {
    return static_cast<size_t>(
        std::min<unsigned __int128>(bins - 1, (unsigned __int128)(t - t0) * bins / span));
  };
  for (uint32_t i = 0; i < pts.size(); ++i) {
    const Point& p = pts[i];
    if (is_slow(p)) continue;
    auto& [lo, hi] = pick[p.track * bins + bin_of(p.start_ns)];
    if (lo == kNone || p.duration_ns < pts[lo].duration_ns) lo = i;
    if (hi == kNone || p.duration_ns > pts[hi].duration_ns) hi = i;
  }
  const auto point_json = [&](const Point& p) {
    return json::array({Round((p.start_ns - t0) / 1e9, 1e-6),
                        Round(std::max<uint64_t>(p.duration_ns, 1) / 1e3, 1e-3), p.label});
  };
  std::vector<json> normal(tracks, json::array()), slow_by_track(tracks, json::array());
  size_t drawn = 0;
  for (const auto& [lo, hi] : pick) {
    for (uint32_t i : {lo, hi}) {
      if (i == kNone || (i == hi && hi == lo)) continue;
      normal[pts[i].track].push_back(point_json(pts[i]));
      ++drawn;
    }
  }
  for (uint32_t i : slow) slow_by_track[pts[i].track].push_back(point_json(pts[i]));
  drawn += slow.size();

  uint64_t dmin = UINT64_MAX, dmax = 1;
  for (const Point& p : pts) {
    dmin = std::min(dmin, std::max<uint64_t>(p.duration_ns, 1));
    dmax = std::max(dmax, p.duration_ns);
  }
  if (pts.empty()) dmin = 1;

  Timeline t;
  const std::vector<std::string> names = c.TrackNames();
  json tr = json::array();
  for (size_t k = 0; k < tracks; ++k) {
    tr.push_back({{"name", k < names.size() ? names[k] : "vCPU"},
                  {"normal", std::move(normal[k])},
                  {"slow", std::move(slow_by_track[k])}});
  }
  // Log axis bounds: whole powers of ten around the data.
  const double ymin = std::pow(10.0, std::floor(std::log10(dmin / 1e3)));
  const double ymax = std::pow(10.0, std::ceil(std::log10(std::max(dmax / 1e3, ymin * 10))));
  t.chart = {{"id", "timeline"},
             {"kind", "timeline"},
             {"title", "Exits over time, per vCPU (log duration)"},
             {"tracks", std::move(tr)},
             {"labels", c.labels()},
             {"t1", Round((t1 - t0) / 1e9, 1e-6)},
             {"ymin", ymin},
             {"ymax", ymax}};
  t.note = fmt::format(
      "{} of {} exits drawn: every slow exit{} ({} slow; slow = {}), and of the others the "
      "longest and the shortest of each of {} time bins per vCPU ({} wide). The rate plot and "
      "the tables count every exit.",
      drawn, pts.size(),
      slow_total > slow.size() ? fmt::format(" up to {} (the longest)", o.max_slow_points) : "",
      slow_total, slow_rule, bins, FormatDurationNs(span / bins));

  // Rate: every exit, per track and bin.
  const size_t rb = std::max<size_t>(1, o.rate_bins);
  std::vector<std::vector<uint64_t>> count(tracks, std::vector<uint64_t>(rb, 0));
  std::vector<uint64_t> slow_count(rb, 0);
  const auto rbin = [&](uint64_t ts) {
    return static_cast<size_t>(
        std::min<unsigned __int128>(rb - 1, (unsigned __int128)(ts - t0) * rb / span));
  };
  for (const Point& p : pts) {
    ++count[p.track][rbin(p.start_ns)];
    if (is_slow(p)) ++slow_count[rbin(p.start_ns)];
  }
  const double width_s = static_cast<double>(span) / rb / 1e9;
  json series = json::array();
  const auto line = [&](std::string name, const std::vector<uint64_t>& v) {
    json data = json::array();
    for (size_t b = 0; b < rb; ++b)
      data.push_back(json::array(
          {Round((b + 0.5) * width_s, 1e-6), Round(static_cast<double>(v[b]) / width_s, 0.1)}));
    series.push_back({{"name", std::move(name)}, {"data", std::move(data)}});
  };
  for (size_t k = 0; k < tracks; ++k) line(k < names.size() ? names[k] : "vCPU", count[k]);
  if (slow_total > 0) line("slow exits (all vCPUs)", slow_count);
  t.rate = {{"id", "rate"},
            {"kind", "rate"},
            {"title", fmt::format("Exit rate over time ({} bins of {})", rb,
                                  FormatDurationNs(static_cast<uint64_t>(width_s * 1e9)))},
            {"series", std::move(series)}};
  return t;
}

// ---- the page --------------------------------------------------------------------------

struct Page {
  std::string title;
  std::string head;  // after <h1>
  std::string nav;   // links
  std::string body;  // sections
  json charts = json::array();

  void Section(std::string_view id, std::string_view heading) {
    nav += fmt::format("<a href=\"#s-{}\">{}</a>", id, Esc(heading));
    body += fmt::format("<h2 id=\"s-{}\">{}</h2>\n", id, Esc(heading));
  }
  void Chart(json c, std::string_view note = {}) {
    if (!note.empty()) body += fmt::format("<p class=\"note\">{}</p>\n", Esc(note));
    body += fmt::format("<div class=\"chart\" id=\"{}\" data-kind=\"{}\"></div>\n",
                        c["id"].get<std::string>(), c["kind"].get<std::string>());
    charts.push_back(std::move(c));
  }
  std::string Finish() const {
    std::string out;
    out.reserve(PlotLibraryJs().size() + body.size() + (1 << 20));
    out +=
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
        // Nothing leaves the page: no request of any kind is allowed.
        "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; "
        "script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src data:\">\n"
        "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n";
    // The page's style and script: web/report.css and web/report.js (html_assets.h).
    out += fmt::format("<title>{}</title>\n<style>\n{}</style>\n</head>\n<body>\n", Esc(title),
                       ReportPageCss());
    out += fmt::format("<h1>{}</h1>\n{}<nav>{}</nav>\n", Esc(title), head, nav);
    out += body;
    out += fmt::format(
        "<h2 id=\"about\">About this page</h2>\n<p class=\"note\">Written by exitscope; it "
        "opens offline and makes no request. Plots drawn by {} (npm package echarts, "
        "dist/echarts.common.min.js, inlined below with its licence).</p>\n"
        "<details><summary>Licence of the plotting library</summary><pre>{}</pre></details>\n",
        Esc(PlotLibraryName()), Esc(PlotLibraryLicense()));
    json data = {{"charts", charts}};
    out += "<script id=\"es-data\" type=\"application/json\">" + ScriptJson(data) +
           "</script>\n<script>\n" + ScriptText(PlotLibraryJs()) + "\n</script>\n<script>\n";
    out += ReportPageJs();
    out += "</script>\n</body>\n</html>\n";
    return out;
  }
};

std::string Pct(uint64_t part, uint64_t whole) {
  return whole ? fmt::format("{:.2f}%", 100.0 * static_cast<double>(part) / whole) : "-";
}

// A breakdown of the exit-health report as the text report's columns.
void HealthTable(std::string& out, std::string_view heading, std::string_view key,
                 const ExitTable& t, double span_s, size_t max_rows) {
  if (t.rows.empty()) return;
  out += fmt::format(
      "<h3>{}</h3>\n<table><tr><th class=\"k\">{}</th><th>count</th><th>rate/s</th>"
      "<th>total</th><th>min</th><th>p50</th><th>p99</th><th>p99.9</th><th>max</th></tr>\n",
      Esc(heading), Esc(key));
  size_t n = 0;
  for (const auto& r : t.rows) {
    if (n++ == max_rows) break;
    const LatencyStats& s = r->stats;
    out += fmt::format(
        "<tr><td class=\"k\">{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td>"
        "<td>{}</td><td>{}</td><td>{}</td></tr>\n",
        Esc(r->key), s.count(), span_s > 0 ? fmt::format("{:.1f}", s.count() / span_s) : "-",
        FormatDurationNs(s.sum()), FormatDurationNs(s.min()), FormatDurationNs(s.Quantile(0.5)),
        FormatDurationNs(s.Quantile(0.99)), FormatDurationNs(s.Quantile(0.999)),
        FormatDurationNs(s.max()));
  }
  out += "</table>\n";
  if (t.rows.size() > max_rows)
    out += fmt::format("<p class=\"note\">{} more rows (--format json lists all)</p>\n",
                       t.rows.size() - max_rows);
}

// The dump's header, plots and tables (inspect's page, and the first half of the joint one).
void DumpSections(Page& p, const Dump& d, const ExitHealthOptions& o, const HtmlPlotOptions& plot,
                  const analysis::ExitSummary& s, const HtmlExitCollector& exits) {
  p.head += fmt::format("<p class=\"meta\">{} &mdash; process {} (pid {}) on {} ({} {}, {})</p>\n",
                        Esc(o.source.empty() ? "dump" : o.source), Esc(d.process.comm),
                        d.process.pid, Esc(d.host.nodename), Esc(d.host.sysname),
                        Esc(d.host.release), Esc(d.host.cpu_model));
  p.head += fmt::format(
      "<p class=\"meta\">{} exits over {:.3f} s, {} inside exits; clock {}{}; slow-exit "
      "threshold {}; watchdog {}; guest data {}</p>\n",
      s.exits, s.span_s(), FormatDurationNs(s.total_ns),
      d.clock.source == ClockSource::kTsc ? "TSC" : "CLOCK_MONOTONIC",
      d.clock.tsc_hz ? fmt::format(" at {:.3f} MHz", d.clock.tsc_hz / 1e6) : "",
      FormatDurationNs(d.slow_exit_threshold_ns), d.watchdog_running ? "on" : "off",
      d.includes_guest_data ? "INCLUDED" : "not included");
  if (o.filter.vcpu || o.filter.device) {
    p.head += "<p class=\"meta\">filter:";
    if (o.filter.vcpu) p.head += fmt::format(" vCPU {}", *o.filter.vcpu);
    if (o.filter.device) p.head += fmt::format(" device {}", Esc(*o.filter.device));
    p.head += "</p>\n";
  }
  for (const std::string& w : d.warnings)
    p.head += fmt::format("<p class=\"meta warn\">warning: {}</p>\n", Esc(w));

  p.Section("histograms", "Latency histograms");
  p.body +=
      "<p class=\"note\">From each row's own histogram (the buckets the analysis keeps), "
      "merged into 4 bins per octave: both axes are log scales. Empty bins are gaps.</p>\n";
  const auto hist = [&](const char* id, const char* what, const ExitTable& t) {
    json c = HistogramChart(id, fmt::format("Exit duration by {}", what), RowsOf(t),
                            plot.histogram_series);
    const size_t left = c["left_out"].get<size_t>();
    p.Chart(std::move(c), left ? fmt::format("{} more {} rows are in the tables below.", left, what)
                               : std::string());
  };
  hist("hist-kind", "kind", s.by_kind);
  hist("hist-device", "device", s.by_device);
  hist("hist-register", "register", s.by_register);

  const Timeline t = BuildTimeline(
      exits, 0, plot,
      fmt::format("the recorder marked it slow (at least {}) or the watchdog saw it stuck",
                  FormatDurationNs(d.slow_exit_threshold_ns)));
  p.Section("timeline", "Exits over time");
  p.Chart(t.chart, t.note);
  p.Chart(t.rate);

  p.Section("tables", "Tables");
  const double span = s.span_s();
  HealthTable(p.body, "Exits by kind", "kind", s.by_kind, span, plot.table_rows);
  HealthTable(p.body, "Exits by device", "device", s.by_device, span, plot.table_rows);
  HealthTable(p.body, "Exits by register", "register", s.by_register, span, plot.table_rows);
  HealthTable(p.body, "Exits by vCPU", "vCPU", s.by_vcpu, span, plot.table_rows);

  p.body += fmt::format("<h3>Slow exits (&ge; {}): {}</h3>\n",
                        FormatDurationNs(d.slow_exit_threshold_ns), s.slow.size());
  if (!s.slow.empty()) {
    p.body +=
        "<table><tr><th>at (s)</th><th>vCPU</th><th class=\"k\">exit</th><th>took</th>"
        "<th class=\"k\">note</th></tr>\n";
    size_t n = 0;
    for (const auto& e : s.slow) {
      if (n++ == plot.table_rows) break;
      p.body += fmt::format(
          "<tr><td>{:+.6f}</td><td>{}</td><td class=\"k\">{}</td><td>{}</td><td class=\"k\">{}"
          "</td></tr>\n",
          (static_cast<double>(e.start_ns) - static_cast<double>(s.first_ns)) / 1e9, e.vcpu,
          Esc(e.description), FormatDurationNs(e.duration_ns),
          e.in_progress                  ? "in progress at dump time"
          : (e.flags & kExitFlagStalled) ? "watchdog saw it stuck"
                                         : "");
    }
    p.body += "</table>\n";
    if (s.slow.size() > plot.table_rows)
      p.body += fmt::format("<p class=\"note\">{} more (--format json lists all)</p>\n",
                            s.slow.size() - plot.table_rows);
  }
  p.body += fmt::format("<h3>Watchdog findings: {}</h3>\n", s.findings.size());
  if (!s.findings.empty()) {
    p.body +=
        "<table><tr><th>at (s)</th><th class=\"k\">finding</th><th class=\"k\">I/Os in "
        "flight</th></tr>\n";
    size_t n = 0;
    for (const auto& f : s.findings) {
      if (n++ == plot.table_rows) break;
      std::string io;
      for (const auto& x : f.in_flight)
        io += fmt::format("{}{} io {} for {}", io.empty() ? "" : "; ", x.device_name, x.io_id,
                          FormatDurationNs(x.age_ns));
      p.body +=
          fmt::format("<tr><td>{:+.6f}</td><td class=\"k\">{}</td><td class=\"k\">{}</td></tr>\n",
                      (static_cast<double>(f.time_ns) - static_cast<double>(s.first_ns)) / 1e9,
                      Esc(f.text.empty() ? std::string(ToString(f.type)) : f.text), Esc(io));
    }
    p.body += "</table>\n";
  }
  const auto& l = s.losses;
  p.body += fmt::format(
      "<h3>Records</h3>\n<table><tr><th class=\"k\">what</th><th>written</th>"
      "<th>overwritten</th><th>dropped</th><th>skipped (torn)</th></tr>\n"
      "<tr><td class=\"k\">exits</td><td>{}</td><td>{}</td><td>-</td><td>{}</td></tr>\n"
      "<tr><td class=\"k\">device events</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>\n"
      "<tr><td class=\"k\">findings</td><td>-</td><td>-</td><td>{}</td><td>-</td></tr>\n"
      "</table>\n",
      l.exits_written, l.exits_overwritten, l.exits_skipped, l.device_events_written,
      l.device_events_overwritten, l.device_events_dropped, l.device_events_skipped,
      l.findings_dropped);

  ExitHealthOptions text = o;
  text.format = OutputFormat::kTable;
  text.max_rows = 0;
  text.max_notable = 0;
  p.body += fmt::format(
      "<details><summary>The text report (exitscope inspect, every row)</summary><pre>{}</pre>"
      "</details>\n",
      Esc(RenderExitHealthTable(d, s, text)));
}

HtmlExitCollector DumpCollector(const analysis::SummaryFilter& f) {
  return HtmlExitCollector(
      [](const ExitEvent& e) { return (e.flags & (kExitFlagSlow | kExitFlagStalled)) != 0; },
      [f](const ExitEvent& e) {
        if (f.vcpu && e.vcpu != *f.vcpu) return false;
        if (!f.device) return true;
        return *f.device == "unassigned" ? e.device.empty() : e.device == *f.device;
      });
}

// The joint view's split as stacked bars, and its tables.
void JointSections(Page& p, const analysis::JointView& v, const JointRenderOptions& o,
                   const HtmlPlotOptions& plot) {
  const analysis::JointGroups g = analysis::GroupJointExits(v.matched);
  const bool sched = v.sched_recorded;
  p.Section("split", "Joint view: where each exit's time went");
  p.body += fmt::format(
      "<p class=\"note\">{} + {} ({}): {} exits matched of {} VMM exits and {} kernel "
      "userspace exits. Each exit's kernel time = kernel before (exit to handler start) + "
      "handler (VMM) + kernel after (handler end to guest entry){}. Bars: each part's share of "
      "the row's summed kernel time (the parts add up to 100%); beside each row its exit count "
      "and mean kernel time; the tooltip gives each part's mean, p50 and p99.</p>\n",
      Esc(o.dump), Esc(o.trace), Esc(v.trace_format), v.matched.size(), v.vmm_exits, v.kernel_exits,
      sched ? fmt::format(" + off-CPU (the vCPU thread switched out, from {} sched_switch "
                          "records; the other parts are then on-CPU time)",
                          v.sched_switches)
            : "; the trace has no sched_switch records, so off-CPU time is inside the parts");
  for (const std::string& w : v.warnings)
    p.body += fmt::format("<p class=\"note warn\">warning: {}</p>\n", Esc(w));
  const auto chart = [&](const char* id, const char* what,
                         const std::vector<analysis::JointGroup>& groups) {
    json cats = json::array(), counts = json::array(), parts = json::array(),
         total_mean = json::array();
    std::vector<std::pair<const char*, analysis::JointPart analysis::JointGroup::*>> defs = {
        {"kernel before", &analysis::JointGroup::before},
        {"handler (VMM)", &analysis::JointGroup::handler},
        {"kernel after", &analysis::JointGroup::after}};
    if (sched) defs.push_back({"off-CPU", &analysis::JointGroup::off_cpu});
    const size_t n = std::min(groups.size(), plot.table_rows);
    for (size_t i = 0; i < n; ++i) {
      cats.push_back(groups[i].key);
      counts.push_back(groups[i].count);
      total_mean.push_back(
          Round(static_cast<double>(groups[i].total.sum_ns) / groups[i].count / 1e3, 1e-3));
    }
    for (const auto& [name, field] : defs) {
      json mean = json::array(), share = json::array(), p50 = json::array(), p99 = json::array();
      for (size_t i = 0; i < n; ++i) {
        const analysis::JointPart& part = groups[i].*field;
        mean.push_back(Round(static_cast<double>(part.sum_ns) / groups[i].count / 1e3, 1e-3));
        const uint64_t total = groups[i].total.sum_ns;
        share.push_back(total ? Round(100.0 * part.sum_ns / total, 0.01) : 0.0);
        p50.push_back(part.p50_ns);
        p99.push_back(part.p99_ns);
      }
      parts.push_back(
          {{"name", name}, {"mean_us", mean}, {"share", share}, {"p50", p50}, {"p99", p99}});
    }
    p.Chart({{"id", id},
             {"kind", "split"},
             {"title", fmt::format("Split of the kernel's exit time by {}", what)},
             {"categories", cats},
             {"counts", counts},
             {"mean_us", total_mean},
             {"parts", parts}},
            groups.size() > n ? fmt::format("{} of {} rows drawn.", n, groups.size()) : "");
  };
  chart("split-kind", "kind", g.by_kind);
  chart("split-device", "device", g.by_device);
  chart("split-register", "register", g.by_register);

  const auto table = [&](const char* heading, const std::vector<analysis::JointGroup>& groups) {
    p.body += fmt::format(
        "<h3>{}</h3>\n<table><tr><th class=\"k\">key</th><th>count</th><th>kernel p50/p99</th>"
        "<th>before p50/p99</th><th>handler p50/p99</th><th>after p50/p99</th>{}"
        "<th>handler share p50/p99</th></tr>\n",
        heading, sched ? "<th>off-CPU p50/p99</th>" : "");
    const auto pair = [](const analysis::JointPart& x) {
      return fmt::format("<td>{} / {}</td>", FormatDurationNs(x.p50_ns),
                         FormatDurationNs(x.p99_ns));
    };
    size_t n = 0;
    for (const analysis::JointGroup& r : groups) {
      if (n++ == plot.table_rows) break;
      p.body += fmt::format(
          "<tr><td class=\"k\">{}</td><td>{}</td>{}{}{}{}{}<td>{:.0f}% / {:.0f}%"
          "</td></tr>\n",
          Esc(r.key), r.count, pair(r.total), pair(r.before), pair(r.handler), pair(r.after),
          sched ? pair(r.off_cpu) : "", r.handler.share_p50 * 100, r.handler.share_p99 * 100);
    }
    p.body += "</table>\n";
  };
  table("Joint view by kind", g.by_kind);
  table("Joint view by device", g.by_device);
  table("Joint view by register", g.by_register);
  JointRenderOptions text = o;
  text.rows = 0;
  p.body += fmt::format(
      "<details><summary>The joint view's text report (slowest exits, unmatched exits)</summary>"
      "<pre>{}</pre></details>\n",
      Esc(RenderJointTable(v, text)));
}

}  // namespace

// ---- collector and tee -----------------------------------------------------------------

HtmlExitCollector::HtmlExitCollector(std::function<bool(const ExitEvent&)> slow,
                                     std::function<bool(const ExitEvent&)> pass, bool group_targets)
    : slow_(std::move(slow)), pass_(std::move(pass)) {
  if (group_targets) {
    devices_ = std::make_unique<analysis::ExitGrouper>(&by_device_);
    registers_ = std::make_unique<analysis::ExitGrouper>(&by_register_);
  }
}

void HtmlExitCollector::Finish() {
  analysis::SortInPlace(by_device_, analysis::RowOrder::kTime);
  analysis::SortInPlace(by_register_, analysis::RowOrder::kTime);
}

void HtmlExitCollector::OnExit(const ExitEvent& e) {
  if (e.end != ExitEnd::kSeen || e.kernel_access) return;
  if (pass_ && !pass_(e)) return;
  auto [it, fresh] = tracks_.try_emplace({e.vm, e.vcpu}, static_cast<uint32_t>(tracks_.size()));
  // The label: reason, and where the access went (device.register and direction).
  scratch_.assign(e.reason);
  if (e.subkey_kind == SubKeyKind::kPort || e.subkey_kind == SubKeyKind::kMmio) {
    scratch_ += ' ';
    scratch_ += e.device.empty() ? fmt::format("unassigned {:#x}", e.subkey)
                                 : (e.reg.empty() ? std::string(e.device)
                                                  : fmt::format("{}.{}", e.device, e.reg));
    if (e.dir != AccessDir::kNone) {
      scratch_ += ' ';
      scratch_ += ToString(e.dir);
    }
  } else if (!e.device.empty()) {
    scratch_ += ' ';
    scratch_ += e.device;
  }
  auto [lit, lfresh] = label_index_.try_emplace(scratch_, static_cast<uint32_t>(labels_.size()));
  if (lfresh) labels_.push_back(scratch_);
  Point p{};
  p.start_ns = e.start_ns;
  p.duration_ns = e.duration_ns;
  // Tracks are numbered in first-seen order; TrackNames renumbers nothing.
  p.track = it->second;
  p.label = lit->second & 0x7fffffffu;
  p.slow = slow_ && slow_(e) ? 1 : 0;
  points_.push_back(p);
  if (devices_ == nullptr) return;
  for (auto [k, g] : {std::pair{analysis::ExitKey::kDevice, devices_.get()},
                      std::pair{analysis::ExitKey::kRegister, registers_.get()}}) {
    analysis::RowKey key;
    if (!analysis::KeyOf(k, e, &key, &scratch_)) continue;
    const analysis::ExitKey kk = k;
    g->Add(g->Row(key, [&] { return analysis::RowText{analysis::KeyText(kk, key), {}}; }), e);
  }
}

std::vector<std::string> HtmlExitCollector::TrackNames() const {
  std::vector<std::string> names(tracks_.size());
  const bool several_vms =
      !tracks_.empty() && tracks_.begin()->first.first != tracks_.rbegin()->first.first;
  for (const auto& [key, index] : tracks_) {
    names[index] = several_vms ? fmt::format("VM {} vCPU {}", key.first, key.second)
                               : fmt::format("vCPU {}", key.second);
  }
  return names;
}

void TeeSink::OnExit(const ExitEvent& e) {
  for (EventSink* s : sinks_) s->OnExit(e);
}
void TeeSink::OnDeviceEvent(const DeviceEvent& e) {
  for (EventSink* s : sinks_) s->OnDeviceEvent(e);
}
void TeeSink::OnFinding(const Finding& f) {
  for (EventSink* s : sinks_) s->OnFinding(f);
}

std::string_view HtmlUnavailable() {
  return PlotLibraryMissing();
}

// ---- the three pages -------------------------------------------------------------------

std::string RenderExitHealthHtml(const Dump& dump, const ExitHealthOptions& options,
                                 const HtmlPlotOptions& plot) {
  HtmlExitCollector exits = DumpCollector(options.filter);
  const analysis::ExitSummary s = analysis::Summarize(dump, options.filter, &exits);
  Page p;
  p.title = "exitscope exit-health report: " + (options.source.empty() ? "dump" : options.source);
  DumpSections(p, dump, options, plot, s, exits);
  return p.Finish();
}

Result<std::string> RenderJointHtml(const Dump& dump, const JointRenderOptions& o,
                                    const HtmlPlotOptions& plot) {
  auto v = analysis::BuildJointViewFromTrace(dump, o.dump, o.trace);
  if (!v) return Propagate(v);
  ExitHealthOptions ho;
  ho.source = o.dump;
  HtmlExitCollector exits = DumpCollector(ho.filter);
  const analysis::ExitSummary s = analysis::Summarize(dump, ho.filter, &exits);
  Page p;
  p.title = fmt::format("exitscope joint view: {} + {}", o.dump, o.trace);
  JointSections(p, *v, o, plot);
  DumpSections(p, dump, ho, plot, s, exits);
  return p.Finish();
}

std::string RenderKvmHtml(const analysis::KvmAnalysis& a, const KvmReportContext& ctx,
                          const KvmRenderOptions& opts, const HtmlExitCollector& exits,
                          std::string_view slow_rule, const HtmlPlotOptions& plot) {
  Page p;
  p.title = fmt::format("exitscope kvm report: {}", ctx.input);
  const ExitTable& all = a.all;
  p.head += fmt::format(
      "<p class=\"meta\">{} ({}), clock {}{}; event class {} ({}); {} samples, {} exits seen, "
      "{} open at end of trace; {} records lost at record time</p>\n",
      Esc(ctx.input), Esc(ctx.format), Esc(ctx.clock),
      ctx.tsc_khz ? fmt::format(", TSC {:.3f} MHz{}", ctx.tsc_khz / 1e3,
                                ctx.tsc_khz_from_host ? " (this host's)" : "")
                  : "",
      analysis::ToString(a.event), Esc(analysis::KvmEventTitle(a.event)), all.samples, a.exits_seen,
      a.open_at_end, ctx.lost_at_record);
  if (ctx.pid >= 0 || ctx.vcpu >= 0)
    p.head += fmt::format("<p class=\"meta\">filter:{}{}</p>\n",
                          ctx.pid >= 0 ? fmt::format(" pid {}", ctx.pid) : "",
                          ctx.vcpu >= 0 ? fmt::format(" vCPU {}", ctx.vcpu) : "");

  p.Section("histograms", "Latency histograms");
  p.body +=
      "<p class=\"note\">From each row's own histogram (the buckets the analysis keeps), "
      "merged into 4 bins per octave: both axes are log scales. Empty bins are gaps.</p>\n";
  {
    json c = HistogramChart("hist-key", fmt::format("Exit duration by {}", KvmEventTitle(a.event)),
                            RowsOf(all), plot.histogram_series);
    const size_t left = c["left_out"].get<size_t>();
    p.Chart(std::move(c),
            left ? fmt::format("{} more rows are in the table below.", left) : std::string());
  }
  // The same exits by the device and the register they touched (resolved with --device-map
  // or --qmp; "unassigned" without one).
  if (!exits.by_device().rows.empty()) {
    p.Chart(HistogramChart("hist-device", "Exit duration by device", RowsOf(exits.by_device()),
                           plot.histogram_series));
    p.Chart(HistogramChart("hist-register", "Exit duration by register",
                           RowsOf(exits.by_register()), plot.histogram_series));
  }

  const Timeline t = BuildTimeline(exits, 0, plot, std::string(slow_rule));
  p.Section("timeline", "Exits over time");
  p.Chart(t.chart, t.note);
  p.Chart(t.rate);

  p.Section("tables", "Tables");
  const auto table = [&](const ExitTable& g) {
    p.body += fmt::format(
        "<h3>{}</h3>\n<table><tr><th class=\"k\">{}</th><th>Samples</th><th>Samples%</th>"
        "<th>Time%</th><th>Min</th><th>Max</th><th>Avg</th><th>+-</th><th>p50</th><th>p99</th>"
        "<th>p99.9</th><th>To VMM</th><th>In kernel</th><th class=\"k\">Name</th></tr>\n",
        g.vm < 0 && g.vcpu < 0 ? std::string("All")
                               : fmt::format("{}{}", g.vm >= 0 ? fmt::format("VM {} ", g.vm) : "",
                                             g.vcpu >= 0 ? fmt::format("vCPU {}", g.vcpu) : ""),
        Esc(analysis::KvmEventTitle(a.event)));
    size_t n = 0;
    for (const auto& r : g.rows) {
      if (n++ == plot.table_rows) break;
      const LatencyStats& s = r->stats;
      const bool timed = s.count() > 0;
      const auto d = [&](uint64_t ns) { return timed ? FormatDurationNs(ns) : std::string("-"); };
      p.body += fmt::format(
          "<tr><td class=\"k\">{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td>"
          "<td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td>"
          "<td class=\"k\">{}</td></tr>\n",
          Esc(r->key), r->samples(), Pct(r->samples(), g.samples),
          timed ? Pct(s.sum(), g.time_ns) : "-", d(s.min()), d(s.max()),
          d(static_cast<uint64_t>(s.mean())),
          timed ? fmt::format("{:.2f}%", s.RelStdErrPercent()) : "-", d(s.Quantile(0.5)),
          d(s.Quantile(0.99)), d(s.Quantile(0.999)), r->to_vmm(), r->in_kernel, Esc(r->name));
    }
    p.body += "</table>\n";
    if (g.rows.size() > plot.table_rows)
      p.body += fmt::format("<p class=\"note\">{} more rows (--format json lists all)</p>\n",
                            g.rows.size() - plot.table_rows);
  };
  table(all);
  if (opts.per_vm)
    for (const auto& g : a.per_vm) table(*g);
  if (opts.per_vcpu)
    for (const auto& g : a.per_vcpu) table(*g);
  p.body += fmt::format(
      "<details><summary>The text report (exitscope kvm report)</summary><pre>{}</pre>"
      "</details>\n",
      Esc(RenderKvmTable(a, ctx, opts)));
  return p.Finish();
}

Status WriteOutputFile(const std::string& path, std::string_view html) {
  const bool out = path.empty() || path == "-";
  std::FILE* f = out ? stdout : std::fopen(path.c_str(), "wb");
  if (f == nullptr)
    return Fail(ErrorCode::kIo,
                fmt::format("-o {}: cannot create: {}", path, std::strerror(errno)));
  const bool ok = std::fwrite(html.data(), 1, html.size(), f) == html.size();
  const bool closed = out ? std::fflush(f) == 0 : std::fclose(f) == 0;
  if (!ok || !closed)
    return Fail(ErrorCode::kIo, fmt::format("-o {}: write failed: {}", path, std::strerror(errno)));
  return {};
}

}  // namespace exitscope::report
